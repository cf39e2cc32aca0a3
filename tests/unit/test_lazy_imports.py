"""`import evora` and the `evora` command import the SDK (aiohttp, ssl) only when it is used:
each `evora` start and each service otherwise paid about half a second of CPU for it. The
package still exports the SDK's names as before. Each service imports only what it uses
(pymongo only where MongoDB is read, aiohttp only where HTTP is served or sent) and builds
the protocol's pydantic models when it first uses them (python -m bench.service_start)."""

from __future__ import annotations

import os
import subprocess
import sys

import evora
import evora.sdk

# What only a command that talks HTTP, or runs an event loop, needs.
HEAVY = ("evora.sdk", "aiohttp", "ssl", "asyncio", "importlib.metadata")


def _imported_by(code: str, modules: tuple[str, ...] = HEAVY) -> list[str]:
    """Which of `modules` a fresh interpreter holds after running `code`."""
    check = f"{code}\nimport sys\nprint(' '.join(m for m in {modules!r} if m in sys.modules))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_package_exports_the_sdk() -> None:
    assert evora.__all__ == evora.sdk.__all__
    for name in evora.__all__:
        assert getattr(evora, name) is getattr(evora.sdk, name), name
    assert set(evora.__all__) <= set(dir(evora))


def test_star_import_and_submodules_still_work() -> None:
    code = (
        "from evora import *\n"
        "from evora import loops\n"
        "assert Client.__module__ == 'evora.sdk.client' and loops.__name__ == 'evora.loops'\n"
        "import evora\n"
        "try:\n"
        "    evora.NoSuchName\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('evora.NoSuchName resolved')\n"
    )
    assert "aiohttp" in _imported_by(code)


def test_import_evora_imports_no_sdk() -> None:
    assert _imported_by("import evora, evora.protocol.states, evora.logs") == []


def test_the_command_line_parser_imports_no_sdk() -> None:
    """What `evora --help`, `evora migrate` and every service pay before their own imports."""
    assert _imported_by("from evora_services.cli import _parser\n_parser()") == []


# The entry modules of the services that never read or write MongoDB.
WITHOUT_MONGODB = "import evora_services.dispatcher.main, evora_services.sweeper.main"


def test_the_dispatcher_and_the_sweeper_import_no_mongodb_client() -> None:
    assert _imported_by(WITHOUT_MONGODB, ("pymongo", "bson")) == []


def test_the_services_that_read_mongodb_still_answer_its_failures_503() -> None:
    """The api and the projector add MongoDB's failures to what their requests answer 503
    for, as every service did when evora.http.app imported pymongo itself."""
    code = (
        "import asyncio\n"
        "from pymongo.errors import ServerSelectionTimeoutError\n"
        "from evora.config import Settings\n"
        "from evora.http.app import UNAVAILABLE\n"
        "from evora_services.api.app import create_app as api\n"
        "from evora_services.projector.app import create_app as projector\n"
        "settings = Settings(database_url='postgresql://x/y', mongo_url='mongodb://x',"
        " auth='disabled')\n"
        "for create in (api, projector):\n"
        "    app = asyncio.run(create(settings))\n"
        "    assert issubclass(ServerSelectionTimeoutError, app[UNAVAILABLE]), create\n"
    )
    assert "pymongo" in _imported_by(code, ("pymongo",))


def test_evora_migrate_imports_no_http_stack() -> None:
    """What `evora migrate` (and `doctor`, `audit`) import before their own work: the
    command line, the settings, the tracing switch and the start-up error lines."""
    code = (
        "from evora_services.cli import _parser\n"
        "_parser()\n"
        "import evora.config, evora.tracing, evora.storage.migrate\n"
        "import evora_services.cli.startup_errors\n"
    )
    assert _imported_by(code, ("aiohttp", "pymongo", "opentelemetry")) == []


def test_importing_a_service_builds_none_of_the_protocols_models() -> None:
    """Each model is built on its first use (a request that carries or answers it): the
    sweeper uses none of them, and the dispatcher few."""
    code = (
        "import evora_services.dispatcher.main, evora_services.sweeper.main\n"
        "import evora_services.api.app\n"
        "import pydantic\n"
        "def every(cls):\n"
        "    for sub in cls.__subclasses__():\n"
        "        yield sub\n"
        "        yield from every(sub)\n"
        "built = sorted(\n"
        "    m.__qualname__ for m in set(every(pydantic.BaseModel))\n"
        "    if m.__module__.startswith(('evora.protocol', 'evora_services'))\n"
        "    and m.__pydantic_complete__\n"
        ")\n"
        "assert not built, built\n"
    )
    assert _imported_by(code, ("pydantic",)) == ["pydantic"]
