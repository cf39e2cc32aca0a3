"""pgqueuer: schema by `Queries.install()`, producer and worker in `pgqueuer_runner.py`
(its settings are described there), run by the cache venv's interpreter. No services."""

from __future__ import annotations

from bench.children import Children
from bench.peers.install import Peers
from bench.system import System


class PgqueuerSystem(System):
    name = "pgqueuer"
    # Completed jobs are deleted from the queue table (and logged elsewhere).
    unfinished_sql = "SELECT EXISTS (SELECT FROM pgqueuer)"

    def __init__(self, children: Children, peers: Peers) -> None:
        super().__init__(children)
        self.peers = peers
        self.dsn = ""

    async def start(self, dsn: str, label: str) -> None:
        self.dsn = dsn
        await self.run_setup(label)

    def runner_argv(self) -> list[str]:
        return [str(self.peers.python), "-m", "bench.peers.pgqueuer_runner", "--dsn", self.dsn]
