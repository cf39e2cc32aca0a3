"""The batch pipeline on Apache Spark: the Parquet event archive (`evora pipeline archive`)
and the analytics over the whole event history (`evora pipeline run`). See README.md."""
