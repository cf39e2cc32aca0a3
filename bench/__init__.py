"""Every benchmark of Evora (figures in docs/benchmarks.md), run from the repository root.

The comparison of Evora as deployed against Graphile Worker and pgqueuer is `python -m
bench compare` (see `bench.__main__`); `python -m bench workflow` runs a fan-out/fan-in
workflow on the same harness (`bench.workflow`). The others are modules of their own, each
`python -m bench.<name>`: `store`, `drain_pg`, `dispatchers`, `attempt_endings`, `audit`,
`projector`, `pipeline`, `worker`, `limits`, `sql_submit` and `typescript_worker`. This
package's root and `bench.runnerkit` import only the standard library: the peers' runner
processes import them from an interpreter that has no Evora installed.
"""
