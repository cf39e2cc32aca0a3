"""The TypeScript SDK (sdks/typescript) against the real services, through node's own test
runner; and jobs crossing between the two SDKs: submitted from Python and worked in
TypeScript, and the reverse."""

from __future__ import annotations

import asyncio

from evora import Client, Handlers, Job, RetryBackoff, Worker
from tests.typescript.conftest import (
    PRODUCER_TOKEN,
    WORKER_TOKEN,
    NodeTools,
    TsStack,
    run_node,
)

FAST = RetryBackoff(initial=0.05, max_delay=0.5)


async def test_the_typescript_suite(node_tools: NodeTools, ts_stack: TsStack) -> None:
    """Client endpoints and errors, retries and timeouts, fencing, cancel, shutdown,
    reconnecting after a dispatcher restart, and the types against /openapi.json."""
    suite = sorted(node_tools.test_dir.glob("*.test.js"))
    assert suite, "no compiled tests"
    await run_node(node_tools, ts_stack, suite)


INTEROP = "interop"
PAYLOADS = [{"n": 1}, "ünïcode ✓", [1, [2, [3]]], None, 12.5, {"deep": {"a": [True, False]}}]


async def test_python_submits_and_typescript_works(
    node_tools: NodeTools, ts_stack: TsStack
) -> None:
    queue = "py-to-ts"
    async with Client(ts_stack.api.url, PRODUCER_TOKEN, retry_backoff=FAST) as client:
        submitted = await client.submit_batch(
            [{"queue": queue, "type": "interop.echo", "payload": p} for p in PAYLOADS]
        )
        await run_node(
            node_tools,
            ts_stack,
            [node_tools.test_dir / INTEROP / "python-to-typescript.test.js"],
            {"EVORA_TEST_QUEUE": queue, "EVORA_TEST_JOB_COUNT": str(len(PAYLOADS))},
        )
        for result, payload in zip(submitted, PAYLOADS, strict=True):
            job = await client.get(result.id)
            assert job["state"] == "COMPLETED", job
            assert job["result"] == {"by": "typescript", "echo": payload}
            assert job["attempt"] == 1


async def test_typescript_submits_and_python_works(
    node_tools: NodeTools, ts_stack: TsStack
) -> None:
    queue = "ts-to-py"
    handlers = Handlers()

    @handlers.job("interop.echo")
    async def echo(job: Job) -> dict[str, object]:
        return {"by": "python", "echo": job.payload}

    worker = Worker(
        ts_stack.dispatcher.url,
        WORKER_TOKEN,
        [queue],
        handlers=handlers,
        wait_seconds=5,
        backoff=FAST,
    )
    serving = asyncio.create_task(worker.serve())
    try:
        await run_node(
            node_tools,
            ts_stack,
            [node_tools.test_dir / INTEROP / "typescript-to-python.test.js"],
            {"EVORA_TEST_QUEUE": queue},
        )
    finally:
        await asyncio.wait_for(worker.stop(), 30)
        await serving
