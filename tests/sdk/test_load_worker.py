"""`evora worker MODULE`: finding the worker or handlers a module defines."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

import evora
from evora.sdk.loading import WorkerLoadError, load_worker, run_worker_from_module
from evora.sdk.settings import DEFAULT_CONCURRENCY, DEFAULT_DISPATCHER_URL

MakeModule = Callable[[str], str]


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> MakeModule:
    """Writes a uniquely named module (so no test sees another's import) and returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(source: str) -> str:
        name = f"evora_test_module_{uuid.uuid4().hex}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return make


HANDLERS = """
    import evora

    handlers = evora.Handlers()

    @handlers.job("a.b")
    async def handle(job):
        return job.payload
"""


def test_handlers_get_a_worker_configured_from_the_environment(make_module: MakeModule) -> None:
    env = {
        "EVORA_DISPATCHER_URL": "http://dispatcher:9000",
        "EVORA_WORKER_TOKEN": "tok",
        "EVORA_WORKER_QUEUES": "emails, sms,",
        "EVORA_WORKER_CONCURRENCY": "7",
        "EVORA_WORKER_PREFETCH": "5",
    }
    worker = load_worker(make_module(HANDLERS), environ=env)
    s = worker.settings
    assert (s.url, s.token, s.queues, s.concurrency, s.prefetch) == (
        "http://dispatcher:9000",
        "tok",
        ("emails", "sms"),
        7,
        5,
    )
    assert worker.handlers.types == ["a.b"]


def test_arguments_win_over_the_environment_and_defaults_fill_the_rest(
    make_module: MakeModule,
) -> None:
    env = {"EVORA_WORKER_QUEUES": "ignored"}
    worker = load_worker(make_module(HANDLERS), queues=["q1"], token="t", environ=env)
    s = worker.settings
    assert (s.url, s.token, s.queues, s.concurrency, s.prefetch) == (
        DEFAULT_DISPATCHER_URL,
        "t",
        ("q1",),
        DEFAULT_CONCURRENCY,
        0,
    )


def test_several_registries_are_merged(make_module: MakeModule) -> None:
    name = make_module(
        HANDLERS
        + """
    more = evora.Handlers()

    @more.job("c.d")
    async def other(job):
        return None
    """
    )
    assert load_worker(name, queues=["q"], environ={}).handlers.types == ["a.b", "c.d"]


def test_a_module_level_worker_runs_with_the_given_overrides(make_module: MakeModule) -> None:
    name = make_module(
        """
        import evora

        worker = evora.Worker("http://configured:1", "tok", ["own"], 3, grace_period=7)
        same_worker = worker

        @worker.handler("x")
        async def handle(job):
            return None
        """
    )
    unchanged = load_worker(name, environ={"EVORA_WORKER_QUEUES": "ignored"})
    assert (unchanged.settings.url, unchanged.settings.queues) == ("http://configured:1", ("own",))
    changed = load_worker(name, queues=["other"], concurrency=9, prefetch=4, environ={})
    s = changed.settings
    assert (s.url, s.token, s.queues, s.concurrency, s.prefetch, s.grace_period) == (
        "http://configured:1",
        "tok",
        ("other",),
        9,
        4,
        7,
    )
    assert changed.handlers.types == ["x"]


@pytest.mark.parametrize(
    ("source", "env", "match"),
    [
        ("x = 1", {"EVORA_WORKER_QUEUES": "q"}, "no evora.Worker and no evora.Handlers"),
        (HANDLERS, {}, "no queues given"),
        (HANDLERS, {"EVORA_WORKER_QUEUES": "q", "EVORA_WORKER_CONCURRENCY": "many"}, "integer"),
        (HANDLERS, {"EVORA_WORKER_QUEUES": "q", "EVORA_WORKER_PREFETCH": "-1"}, "PREFETCH"),
        (HANDLERS, {"EVORA_WORKER_QUEUES": "bad queue"}, "invalid queue name"),
        ("import evora\nh = evora.Handlers()", {"EVORA_WORKER_QUEUES": "q"}, "no handlers"),
        (
            """
            import evora
            a = evora.Worker("http://h:1", None, ["q"])
            b = evora.Worker("http://h:1", None, ["q"])
            """,
            {},
            "2 evora.Worker objects",
        ),
    ],
)
def test_modules_that_give_no_runnable_worker(
    make_module: MakeModule,
    source: str,
    env: dict[str, str],
    match: str,
) -> None:
    with pytest.raises(WorkerLoadError, match=match):
        load_worker(make_module(source), environ=env)


def test_a_missing_module_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    status = run_worker_from_module(
        "no_such_module_here", url=None, token=None, queues=["q"], concurrency=None
    )
    assert status == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("evora worker: cannot import no_such_module_here") and err.count("\n") == 1
    )


def test_an_import_error_inside_the_module_is_not_disguised(make_module: MakeModule) -> None:
    name = make_module("import a_dependency_that_is_not_installed")
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed"):
        load_worker(name, queues=["q"], environ={})


def test_the_example_module_loads() -> None:
    worker = load_worker("examples.worker_example", queues=["demo"], environ={})
    assert worker.handlers.types == [
        "demo.echo",
        "demo.fail",
        "demo.fatal",
        "demo.hash",
        "demo.sleep",
    ]
    assert isinstance(worker, evora.Worker)
