"""`spark-submit` entry point for the Evora pipeline.

    spark-submit --master <master> --jars /usr/share/java/postgresql.jar \
        /app/spark/submit.py run            # = `evora pipeline run`
    spark-submit ... /app/spark/submit.py archive   # = `evora pipeline archive`

spark-submit starts the JVM (master, jars, executors, configuration from its flags) and then
runs this file; the pipeline's SparkSession attaches to that JVM instead of starting a
local one. The arguments are those of `evora pipeline`.
"""

import sys

from evora_services.cli import main

if __name__ == "__main__":
    raise SystemExit(main(["pipeline", *sys.argv[1:]]))
