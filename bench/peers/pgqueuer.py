"""pgqueuer: schema by `Queries.install()`, producer and worker in `pgqueuer_runner.py`
(its settings are described there), run by the cache venv's interpreter. No services."""

from __future__ import annotations

from bench.peers.peer import PeerSystem


class PgqueuerSystem(PeerSystem):
    name = "pgqueuer"
    # Completed jobs are deleted from the queue table (and logged elsewhere).
    unfinished_sql = "SELECT EXISTS (SELECT FROM pgqueuer)"

    def runner_argv(self) -> list[str]:
        return [str(self.peers.python), "-m", "bench.peers.pgqueuer_runner", "--dsn", self.dsn]
