"""`evora worker MODULE`: finding the worker a module defines, and running it."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeVar

from evora.sdk.errors import EvoraClientError
from evora.sdk.handlers import Handlers
from evora.sdk.settings import DEFAULT_CONCURRENCY, DEFAULT_DISPATCHER_URL
from evora.sdk.worker import Worker

ENV_DISPATCHER_URL: Final = "EVORA_DISPATCHER_URL"
ENV_WORKER_TOKEN: Final = "EVORA_WORKER_TOKEN"
ENV_WORKER_QUEUES: Final = "EVORA_WORKER_QUEUES"
ENV_WORKER_CONCURRENCY: Final = "EVORA_WORKER_CONCURRENCY"
ENV_WORKER_PREFETCH: Final = "EVORA_WORKER_PREFETCH"


class WorkerLoadError(Exception):
    """MODULE cannot give a worker; the message is one human-readable line."""


_T = TypeVar("_T")


def _instances(values: Iterable[object], cls: type[_T]) -> list[_T]:
    # By identity: a module may hold the same object under two names.
    return list({id(value): value for value in values if isinstance(value, cls)}.values())


def load_worker(
    module_name: str,
    *,
    url: str | None = None,
    token: str | None = None,
    queues: Sequence[str] | None = None,
    concurrency: int | None = None,
    prefetch: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Worker:
    """The worker `evora worker MODULE` runs; see `run_worker_from_module`."""
    # Like `python -m`: a module next to where the command runs is importable.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name + ".").startswith(exc.name + "."):
            raise WorkerLoadError(f"cannot import {module_name}: {exc}") from exc
        raise
    values = list(vars(module).values())
    try:
        worker = _worker_from(
            module_name, values, url, token, queues, concurrency, prefetch, environ
        )
    except ValueError as exc:
        raise WorkerLoadError(str(exc)) from exc
    if not (worker.settings.types or worker.handlers.types):
        raise WorkerLoadError(f"{module_name} registers no handlers")
    return worker


def _worker_from(
    module_name: str,
    values: list[object],
    url: str | None,
    token: str | None,
    queues: Sequence[str] | None,
    concurrency: int | None,
    prefetch: int | None,
    environ: Mapping[str, str] | None,
) -> Worker:
    workers = _instances(values, Worker)
    if len(workers) > 1:
        raise WorkerLoadError(f"{module_name} defines {len(workers)} evora.Worker objects")
    if workers:
        return workers[0].reconfigured(
            url=url, token=token, queues=queues, concurrency=concurrency, prefetch=prefetch
        )
    registries = _instances(values, Handlers)
    if not registries:
        raise WorkerLoadError(f"{module_name} defines no evora.Worker and no evora.Handlers")
    handlers = Handlers()
    for registry in registries:
        handlers.include(registry)
    env = os.environ if environ is None else environ
    queue_names = queues or [q.strip() for q in env.get(ENV_WORKER_QUEUES, "").split(",")]
    queue_names = [name for name in queue_names if name]
    if not queue_names:
        raise WorkerLoadError(f"no queues given: pass them or set {ENV_WORKER_QUEUES}")
    if concurrency is None:
        concurrency = _count(env, ENV_WORKER_CONCURRENCY, DEFAULT_CONCURRENCY)
    if prefetch is None:
        prefetch = _count(env, ENV_WORKER_PREFETCH, 0)
    return Worker(
        url or env.get(ENV_DISPATCHER_URL) or DEFAULT_DISPATCHER_URL,
        token or env.get(ENV_WORKER_TOKEN) or None,
        queue_names,
        concurrency,
        handlers=handlers,
        prefetch=prefetch,
    )


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if raw and not raw.isdigit():
        raise WorkerLoadError(f"{name} must be an integer, got {raw!r}")
    return int(raw) if raw else default


def run_worker_from_module(
    module_name: str,
    *,
    url: str | None,
    token: str | None,
    queues: list[str] | None,
    concurrency: int | None,
    prefetch: int | None = None,
) -> int:
    """Run the worker MODULE defines until SIGTERM/SIGINT; the exit status is returned.

    MODULE is imported (the current directory is importable, as with `python -m`), then:

    - if it holds an `evora.Worker`, that worker runs, with `url`, `token`, `queues`,
      `concurrency` and `prefetch` replacing its own settings where given (not None);
    - otherwise its `evora.Handlers` registries (all of them, merged) are run by a new
      worker configured from the arguments, else from the environment:
      `EVORA_DISPATCHER_URL` (default http://127.0.0.1:8081), `EVORA_WORKER_TOKEN`,
      `EVORA_WORKER_QUEUES` (comma-separated, required one way or the other),
      `EVORA_WORKER_CONCURRENCY` (default 10) and `EVORA_WORKER_PREFETCH` (default 0).

    Returns 0 after a graceful stop, 1 when the dispatcher refused the worker (bad token,
    say), 2 when MODULE gives no runnable worker; problems are printed on one line to
    stderr.
    """
    try:
        worker = load_worker(
            module_name,
            url=url,
            token=token,
            queues=queues,
            concurrency=concurrency,
            prefetch=prefetch,
        )
    except WorkerLoadError as exc:
        print(f"evora worker: {exc}", file=sys.stderr)
        return 2
    try:
        worker.run()
    except EvoraClientError as exc:
        print(f"evora worker: {exc}", file=sys.stderr)
        return 1
    return 0
