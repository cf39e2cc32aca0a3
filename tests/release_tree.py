"""An earlier release's code, unpacked from git, and the environment that runs it with this
repository's venv: the upgrade tests drive a database with the code that wrote it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
# the source roots of either layout (`evora_services` moved into `services/`)
CODE_ROOTS = ("shared", "services", "evora_services")


def unpack_release(commit: str, into: Path, roots: tuple[str, ...] = CODE_ROOTS) -> Path:
    """The folders `roots` (those the commit has) of `commit`, unpacked at `into`."""
    found = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if found.returncode != 0:
        pytest.fail(
            f"the earlier release's commit {commit} is not in this clone: the upgrade test "
            "needs the whole history (git fetch --unshallow)"
        )
    listing = ["git", "-C", str(REPO), "ls-tree", "--name-only", commit]
    present = subprocess.run(
        [*listing, *roots], capture_output=True, text=True, check=True
    ).stdout.split()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, *present], capture_output=True, check=True
    ).stdout
    into.mkdir()
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def release_env(tree: Path, env: dict[str, str]) -> dict[str, str]:
    """The environment of a child process running `tree`'s code with the repo's venv (run in
    `tree`: `python -m` puts the working directory first on the path)."""
    # either layout: `evora_services` in `services/` or, before it moved, at the top (the cwd)
    path = os.pathsep.join([str(tree / "shared"), str(tree / "services"), str(tree)])
    return {**os.environ, **env, "PYTHONPATH": path}


async def run_release_script(tree: Path, script: str, *args: str) -> Any:
    """`script` run by `tree`'s code in a child process (`python -c script args...`, in
    `tree`): the JSON of the last line it printed."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        *args,
        env=release_env(tree, {}),
        cwd=tree,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 240)
    assert process.returncode == 0, err.decode()
    return json.loads(out.decode().splitlines()[-1])
