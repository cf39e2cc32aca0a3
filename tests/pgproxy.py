"""A TCP proxy between a client and the test PostgreSQL that spoils chosen connections at
a chosen step: for tests of code that must survive whatever connecting can throw."""

from __future__ import annotations

import asyncio
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

# How a connection is spoilt: cut, or answered with a message the client cannot use and
# then cut.
Fault = Literal["cut", "unknown-auth", "broken-auth"]
ANSWERS: dict[Fault, bytes] = {
    # an authentication request for a method no client knows (asyncpg: InterfaceError)
    "unknown-auth": b"R" + (8).to_bytes(4, "big") + (99).to_bytes(4, "big"),
    # an authentication request too short to hold its code (asyncpg: InternalClientError)
    "broken-auth": b"R" + (3).to_bytes(4, "big"),
}


class FaultyProxy:
    """A TCP proxy to PostgreSQL that spoils the next connection when its client sends its
    k-th chunk (SSL request, startup, first query, ...), so the client fails in the middle
    of that step."""

    def __init__(self, upstream: str) -> None:
        self._upstream = urlsplit(upstream)
        self.fault_next: tuple[Fault, int] | None = None
        self.faults = 0
        self.chunks: list[int] = []  # chunks each connection's client sent so far
        self._server: asyncio.Server | None = None

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        netloc = f"{self._upstream.username or 'postgres'}@127.0.0.1:{port}"
        return urlunsplit(self._upstream._replace(netloc=netloc))

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _serve(self, client: asyncio.StreamReader, to_client: asyncio.StreamWriter) -> None:
        fault, self.fault_next = self.fault_next, None
        index = len(self.chunks)
        self.chunks.append(0)
        server, to_server = await asyncio.open_connection(
            self._upstream.hostname, self._upstream.port
        )

        async def upstream() -> None:
            while data := await client.read(65536):
                if fault is not None and self.chunks[index] + 1 == fault[1]:
                    self.faults += 1
                    if answer := ANSWERS.get(fault[0]):
                        to_client.write(answer)
                        await to_client.drain()
                    return
                self.chunks[index] += 1
                to_server.write(data)
                await to_server.drain()

        async def downstream() -> None:
            while data := await server.read(65536):
                to_client.write(data)
                await to_client.drain()

        pipes = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            to_client.close()
            to_server.close()
