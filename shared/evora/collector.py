"""The garbage collector of a process that Evora runs: a service, or a worker run by
`Worker.run()`.

Once a process has started, what it built to get there (modules, the app or the worker, its
pools and sessions, tens of thousands of objects) is frozen out of the collector's scans, and
the youngest generation is collected every GC_YOUNG_THRESHOLD allocations, not every 700.
A request of 1,000 submissions holds ~8,000 containers until it is answered, and a worker's
claim of 100 jobs about as many until they end: with Python's defaults each ran a dozen young
collections, each promoting what was still held, which set off collections of the middle
generation and full ones over the whole heap. That was half the api's Python CPU per
submitted job (docs/benchmarks/2026-11-29-submit-cost.md) and a quarter of the SDK worker's
per drained job (docs/benchmarks/2026-11-29-dispatcher-and-worker-cpu.md). Garbage in
cycles is still collected, later. Only a process's own entry point calls `settle`
(`run_service`, `Worker.run`): a program that embeds a server or a worker (a test, an
application calling `Worker.serve()`) keeps its collector as it is.
"""

from __future__ import annotations

import gc

# Allocations of container objects between two collections of the youngest generation
# (Python's default is 700).
GC_YOUNG_THRESHOLD = 10_000


def settle() -> None:
    gc.collect()  # what startup left as garbage is freed, not frozen for good
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
