"""`evora` commands as child processes forked from one interpreter that imported the command
once. Each `python -m evora_services.cli` start cost 0.55 s of CPU (measured on a loaded
2-core machine), nearly all of it imports (the SDK and aiohttp, for an operator command), a
forked one 0.06 s; test_operator_commands runs 42 commands to check what they print and the
exit status they end with, none of which depends on the imports being fresh.

The server (`python -m tests.cli.forkserver`) reads one request a line (JSON: argv, the
whole environment, the working directory) and forks; the child takes that environment,
directory and an stdin of /dev/null, writes its stdout and stderr to files of its own, and
runs `evora_services.cli` as `python -m` does, to the interpreter's own exit: the exit
status, an uncaught exception's traceback and the at-exit flushing are the interpreter's,
as in a fresh process. A fresh interpreter's start is left to the other files of tests/cli,
which run `evora` as a new process (commands.evora)."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import runpy
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import IO, NoReturn, TypedDict

from tests.cli.commands import REPO, clean_environment

# What `evora_services.cli.main` imports for an operator command (jobs, queues, dlq, ...).
PRELOADED = ("evora_services.cli", "evora_services.cli.admin.run")


class Request(TypedDict):
    argv: list[str]
    env: dict[str, str]
    cwd: str


class Reply(TypedDict):
    returncode: int
    stdout: str
    stderr: str


class Forks:
    """A running fork server; `await forks.evora(...)` is `commands.evora_async(...)`."""

    def __init__(self) -> None:
        self._server = subprocess.Popen(
            [sys.executable, "-m", "tests.cli.forkserver"],
            cwd=REPO,
            env=clean_environment(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._one_at_a_time = threading.Lock()

    async def evora(
        self, *args: str, env: Mapping[str, str] = {}
    ) -> subprocess.CompletedProcess[str]:
        """`evora *args` while this event loop goes on serving (the servers of the test run
        in it): the exchange with the server blocks a thread, not the loop."""
        request = Request(argv=list(args), env=clean_environment(env), cwd=os.getcwd())
        reply = await asyncio.wait_for(asyncio.to_thread(self._exchange, request), 60)
        return subprocess.CompletedProcess(
            list(args), reply["returncode"], reply["stdout"], reply["stderr"]
        )

    def _exchange(self, request: Request) -> Reply:
        assert self._server.stdin is not None and self._server.stdout is not None
        with self._one_at_a_time:
            self._server.stdin.write(json.dumps(request) + "\n")
            self._server.stdin.flush()
            line = self._server.stdout.readline()
        assert line, f"the fork server ended (status {self._server.poll()})"
        reply: Reply = json.loads(line)
        return reply

    def close(self) -> None:
        assert self._server.stdin is not None
        self._server.stdin.close()  # the server ends at the end of its input
        try:
            self._server.wait(10)
        except subprocess.TimeoutExpired:
            self._server.kill()
            self._server.wait()


def _serve() -> None:
    for module in PRELOADED:
        __import__(module)
    # What the server imported stays out of the collector's sight: a child's collections
    # would otherwise write to every object's header and copy the pages they share.
    gc.freeze()
    for line in sys.stdin:
        request: Request = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()  # nothing of this process's may reach the child's output
            pid = os.fork()
            if pid == 0:
                _become_evora(request, out, err)
            _, status = os.waitpid(pid, 0)
            out.seek(0)
            err.seek(0)
            reply = Reply(
                returncode=os.waitstatus_to_exitcode(status),
                stdout=out.read().decode(),
                stderr=err.read().decode(),
            )
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def _become_evora(request: Request, out: IO[bytes], err: IO[bytes]) -> NoReturn:
    """The forked child: `python -m evora_services.cli *argv` from here on. SystemExit, or
    any exception, unwinds to the top of this interpreter, which ends as `python -m` would."""
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["-m", *request["argv"]]  # run_module puts the module's path first, as `-m` does
    runpy.run_module("evora_services.cli", run_name="__main__", alter_sys=True)
    raise SystemExit(0)  # its __main__ raises SystemExit itself; a script that ends is 0


if __name__ == "__main__":
    _serve()
