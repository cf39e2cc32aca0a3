"""Comparative benchmark of Evora as deployed against Graphile Worker and pgqueuer.

`python -m bench compare` (see `bench.__main__`); `python -m bench workflow` runs a
fan-out/fan-in workflow on the same harness (`bench.workflow`). This package's root and
`bench.runnerkit` import only the standard library: the peers' runner processes import them
from an interpreter that has no Evora installed.
"""
