"""What every peer system shares: its runner process does setup, producing and working
itself against one database; the subclass names the runner."""

from __future__ import annotations

from bench.children import Children
from bench.peers.install import Peers
from bench.system import System


class PeerSystem(System):
    def __init__(self, children: Children, peers: Peers) -> None:
        super().__init__(children)
        self.peers = peers
        self.dsn = ""

    async def start(self, dsn: str, label: str) -> None:
        self.dsn = dsn
        await self.run_setup(label)
