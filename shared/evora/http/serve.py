"""Running a service: listen, drain on SIGTERM, shut down in order.

On a stop signal the service first reports not-ready (so load balancers stop sending), waits
`drain_seconds`, stops listening, runs the app's shutdown hooks (the dispatcher answers
waiting long-polls there), lets in-flight requests finish within `shutdown_timeout`, then
runs cleanup (pools close).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
from collections.abc import Awaitable, Callable

from aiohttp import web

from evora import collector, loops
from evora.http.app import LIFECYCLE, METRICS, SETTINGS
from evora.http.protocol import HEAD_TIMEOUT_S, LINGER_S, Connections, EdgeProtocol

log = logging.getLogger(__name__)

AppFactory = Callable[[], Awaitable[web.Application]]

# Files a service opens besides its connections: database pool, LISTEN, logs, libraries.
OPEN_FILES_HEADROOM = 256


async def serve_app(
    app: web.Application,
    *,
    name: str,
    host: str,
    port: int,
    stop: asyncio.Event,
    drain_seconds: float = 0.0,
    shutdown_timeout: float = 30.0,
    started: Callable[[int], None] | None = None,
    handler_cancellation: bool = False,
    head_timeout: float = HEAD_TIMEOUT_S,
) -> None:
    """`handler_cancellation` cancels a handler whose client disconnected (the dispatcher
    uses it to stop waiting for, and release jobs claimed for, a worker that left).
    `head_timeout` bounds how long a request's line and headers may take to arrive."""
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        handler_cancellation=handler_cancellation,
    )
    await runner.setup()
    listener: asyncio.Server | None = None
    limit = app[SETTINGS].max_connections
    _raise_open_files(limit + OPEN_FILES_HEADROOM)
    connections = Connections(limit, app[METRICS])
    try:
        listener = await _listen(runner, host, port, head_timeout, connections)
        bound = int(listener.sockets[0].getsockname()[1]) if listener.sockets else port
        log.info("%s listening on http://%s:%d", name, host, bound)
        if started is not None:
            started(bound)
        await stop.wait()
        log.info("%s draining", name)
        app[LIFECYCLE].draining = True
        if drain_seconds > 0:
            await asyncio.sleep(drain_seconds)
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()
        log.info("%s stopped", name)


async def _listen(
    runner: web.AppRunner, host: str, port: int, head_timeout: float, connections: Connections
) -> asyncio.Server:
    """What `web.TCPSite` does, with `EdgeProtocol` handling each connection. The runner's
    server still tracks the connections, so shutdown treats them as it would its own."""
    server = runner.server
    assert server is not None, "the runner is set up"
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: EdgeProtocol(
            server,
            connections=connections,
            loop=loop,
            access_log=None,
            head_timeout=head_timeout,
            lingering_time=LINGER_S,
        ),
        host,
        port,
    )


def _raise_open_files(wanted: int) -> None:
    """Let the process open `wanted` files if its hard limit allows: a soft limit below the
    connection limit (often 1024) would fail accepts first, with errors instead of 503s."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < ceiling:
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
    if ceiling < wanted:
        log.warning(
            "the open-files limit (%d) is below EVORA_MAX_CONNECTIONS plus room for the "
            "process's own files (%d): connections beyond it fail instead of being answered 503",
            ceiling,
            wanted,
        )


def settle_collector(_port: int = 0) -> None:
    """Once a service process listens: its collector settled (`evora.collector`)."""
    collector.settle()


def stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def run_service(
    factory: AppFactory, *, name: str, host: str, port: int, handler_cancellation: bool = False
) -> int:
    """Entry point of `evora <service>`: serve until SIGINT/SIGTERM, then drain."""

    async def main() -> None:
        stop = asyncio.Event()
        stop_on_signals(stop)
        app = await factory()
        await serve_app(
            app,
            name=name,
            host=host,
            port=port,
            stop=stop,
            started=settle_collector,
            handler_cancellation=handler_cancellation,
        )

    loops.run(main())
    return 0
