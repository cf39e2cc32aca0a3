"""graphile-worker 0.18 on Node 22: schema by `WorkerUtils.migrate()`, producer and worker
in `graphile_runner.mjs` (its settings are described there). No service processes."""

from __future__ import annotations

from bench.peers.peer import PeerSystem


class GraphileSystem(PeerSystem):
    name = "graphile"
    # Completed jobs are deleted; failed ones would stay (none fail here).
    unfinished_sql = "SELECT EXISTS (SELECT FROM graphile_worker._private_jobs)"
    schemas = ("graphile_worker",)

    def runner_argv(self) -> list[str]:
        return [str(self.peers.node), str(self.peers.graphile_runner), "--dsn", self.dsn]
