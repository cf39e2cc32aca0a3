"""The dispatcher app: worker routes on the shared base, one pool, one LISTEN connection,
the wake-up machinery and its fallback poll."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from evora import tracing
from evora.config import Settings
from evora.http.app import METRICS, create_base_app, open_pool
from evora.http.routing import install
from evora.storage.fairness import FairnessStore
from evora.storage.jobs import JobStore, coalescing
from evora.storage.limits import LimitStore
from evora.storage.listener import Listener
from evora_services.dispatcher.fairness import FairnessWatch
from evora_services.dispatcher.limits import LimitWatch
from evora_services.dispatcher.metrics import DispatcherMetrics
from evora_services.dispatcher.routes import routes
from evora_services.dispatcher.state import DISPATCH, Dispatch
from evora_services.dispatcher.unclaimed import UnclaimedWatch
from evora_services.dispatcher.wakeups import POLL_SECONDS, Cause, Wakeups, poll_forever

log = logging.getLogger(__name__)


async def create_app(settings: Settings) -> web.Application:
    settings.require("database_url")
    session = settings.session_database()
    if session is None:
        log.warning(
            "no LISTEN behind a transaction-mode pooler (EVORA_DATABASE_POOLER=transaction) "
            "without EVORA_DIRECT_DATABASE_URL: long-polls are woken by polling, every %.0fs",
            POLL_SECONDS,
        )
    app = create_base_app(settings, "dispatcher", "Evora dispatcher")
    install(app, routes)
    metrics = DispatcherMetrics(app[METRICS])

    async def resources(app: web.Application) -> AsyncIterator[None]:
        # Every statement of the dispatcher is a one-job or one-batch operation on indexed
        # rows, so each is planned once per connection instead of on every call (issue 33:
        # the planning of a one-job claim cost more than running it); the api and the sweeper
        # stay on PostgreSQL's default (docs/deploy.md says why).
        pool = await open_pool(app, "dispatcher", generic_plans=True)
        store = JobStore(pool)

        async def due_in(queue: str) -> float | None:
            return await store.seconds_until_due([queue])

        def observe(queue: str, cause: Cause) -> None:
            metrics.wakeups.labels(cause.value).inc()

        wakeups = Wakeups(due_in, observe)

        def listening(up: bool) -> None:
            wakeups.set_listening(up)
            metrics.listener_connected.set(1 if up else 0)

        app[DISPATCH] = Dispatch(
            store=store,
            wakeups=wakeups,
            metrics=metrics,
            completions=coalescing(store.complete_many),
            failures=coalescing(store.fail_many),
            tracer=tracing.tracer("evora.dispatcher"),
        )
        unclaimed = UnclaimedWatch(pool, app[METRICS].registry, settings.unclaimed_warning_seconds)
        limits = LimitWatch(LimitStore(pool), app[METRICS].registry)
        fairness = FairnessWatch(FairnessStore(pool), app[METRICS].registry)
        tasks = [
            asyncio.create_task(poll_forever(wakeups)),
            asyncio.create_task(unclaimed.run_forever()),
            asyncio.create_task(limits.run_forever()),
            asyncio.create_task(fairness.run_forever()),
        ]
        if session is not None:
            listener = Listener(
                session[0],
                on_notify=wakeups.notify,
                on_reconnect=lambda: wakeups.poll(Cause.RECONNECT),
                on_state=listening,
                name="evora-dispatcher-listen",
                pooler=session[1],
            )
            tasks.append(asyncio.create_task(listener.run()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await app[DISPATCH].completions.close()
            await app[DISPATCH].failures.close()
            await store.close()
            await pool.close()

    async def answer_waiting_polls(app: web.Application) -> None:
        # Before in-flight requests are awaited: waiting long-polls answer [] at once.
        app[DISPATCH].wakeups.close()

    app.cleanup_ctx.append(resources)
    app.on_shutdown.append(answer_waiting_polls)
    return app
