"""The TypeScript SDK as a user installs it: `npm pack` of sdks/typescript, installed into an
empty project, imported by its name (`evora-queue`: ours on npm) from an ES module."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.typescript.conftest import PACKAGE, NodeTools, install_packed_sdk

USE = """\
import { Client, Worker, NonRetryableError } from "evora-queue";
const client = new Client({ url: "http://127.0.0.1:1", token: "a-producer-token" });
const worker = new Worker({ url: "http://127.0.0.1:1", token: "a-worker-token-16", queues: ["q"] });
console.log(typeof client.submit, typeof worker.handle, new NonRetryableError("x").name);
"""


def test_the_packed_sdk_installs_into_a_clean_project(
    node_tools: NodeTools, tmp_path: Path
) -> None:
    manifest = json.loads((PACKAGE / "package.json").read_text())
    assert manifest["name"] == "evora-queue"
    project = tmp_path / "project"
    tarball = install_packed_sdk(node_tools, project)
    assert tarball.name == f"evora-queue-{manifest['version']}.tgz"
    (project / "use.js").write_text(USE)
    used = subprocess.run(
        [node_tools.node, "use.js"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert used.returncode == 0, used.stderr
    assert used.stdout.strip() == "function function NonRetryableError", used.stdout
