"""Regenerates sdks/typescript/src/generated/ from the services' OpenAPI documents, built in
this process (no database or running service needed):

    python -m tests.typescript.regenerate

Run it after changing an endpoint or a model of the api or the dispatcher; the TypeScript
tests fail until the generated types match what the services serve. Needs Node.js and the
package installed (`npm ci` in sdks/typescript).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
from pathlib import Path

from evora.config import Settings
from evora.http.openapi import openapi_document
from evora_services.api.app import create_app as create_api
from evora_services.dispatcher.app import create_app as create_dispatcher
from tests.typescript.conftest import PACKAGE, TOKENS

# Only the documents are built: nothing connects to this database.
SETTINGS = Settings(database_url="postgresql://evora@127.0.0.1:9/evora", tokens=TOKENS)


async def documents() -> dict[str, dict[str, object]]:
    return {
        "api": openapi_document(await create_api(SETTINGS), "api"),
        "dispatcher": openapi_document(await create_dispatcher(SETTINGS), "dispatcher"),
    }


def main() -> None:
    built = asyncio.run(documents())
    subprocess.run(["node", "node_modules/typescript/bin/tsc", "-p", "."], cwd=PACKAGE, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = []
        for service, document in built.items():
            path = Path(tmp) / f"{service}.json"
            path.write_text(json.dumps(document))
            args.append(f"{service}={path}")
        subprocess.run(["node", "dist/tools/generate.js", *args], cwd=PACKAGE, check=True)


if __name__ == "__main__":
    main()
