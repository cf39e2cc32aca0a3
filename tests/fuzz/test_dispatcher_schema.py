"""The running `evora dispatcher` answers what its /openapi.json says, for over a thousand
generated requests (see schemafuzz), with the worker token. Generated job ids name real
RUNNING jobs with their current lease tokens about half the time, so heartbeats, completes,
fails and releases also succeed and move jobs, not only answer 404."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import schemathesis

from tests.e2e.conftest import WORKER_HEADERS, Children
from tests.fuzz.conftest import seed, spawn
from tests.fuzz.schemafuzz import fuzz, real_jobs

EXAMPLES = 160  # per operation and generation mode


# 55-80 s on an idle 2-core machine, over 300 s (the suite's limit) on one doing four
# times its work: the limit is for tests that hang, which this one does not.
@pytest.mark.timeout(900)
async def test_dispatcher_answers_as_documented(children: Children, module_db_url: str) -> None:
    seeded = await seed(module_db_url, running=200, each_other_state=5)
    _, url = await spawn(children, "dispatcher", module_db_url)
    with_real_jobs = real_jobs(seeded)

    def prepare(case: schemathesis.Case[Any]) -> None:
        with_real_jobs(case)
        # A long-poll would only wait out its time: any valid wait becomes 0 (still valid);
        # an invalid one stays, it is what a negative case got wrong.
        body = case.body
        if case.path == "/v1/claim" and isinstance(body, dict):
            wait = body.get("wait_seconds", 0)
            if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 <= wait <= 60:
                body["wait_seconds"] = 0

    report = await asyncio.to_thread(fuzz, url, WORKER_HEADERS, examples=EXAMPLES, prepare=prepare)
    print(report.summary("dispatcher"))
    assert not report.failures, "\n\n".join(report.failures)
    assert report.requests >= 1500
