"""docs/sdk-typescript.md is what sdks/typescript/tools/reference.ts writes from the
package's exports (signatures and doc comments): an export added, changed or re-documented
fails here until it is regenerated (`npm run reference` in sdks/typescript)."""

from __future__ import annotations

import subprocess

from tests.typescript.conftest import PACKAGE, NodeTools

REFERENCE = PACKAGE.parents[1] / "docs" / "sdk-typescript.md"


def test_the_typescript_sdk_reference_is_current(node_tools: NodeTools) -> None:
    written = subprocess.run(
        [node_tools.node, "dist/tools/reference.js"],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert written.stdout == REFERENCE.read_text(), (
        "docs/sdk-typescript.md is stale: npm run reference (in sdks/typescript)"
    )
