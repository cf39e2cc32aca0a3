"""The running `evora api` (with its MongoDB read models) answers what its /openapi.json
says, for over a thousand generated requests (see schemafuzz), with the admin token, which
may call every endpoint. Generated job ids name real jobs in every state about half the
time, so cancel, retry and discard also succeed or meet a 409, not only a 404."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.e2e.conftest import Children
from tests.fuzz.conftest import ADMIN, seed, spawn
from tests.fuzz.schemafuzz import fuzz, real_jobs

EXAMPLES = 80  # per operation and generation mode


# 55-80 s on an idle 2-core machine, over 300 s (the suite's limit) on one doing four
# times its work: the limit is for tests that hang, which this one does not.
@pytest.mark.timeout(900)
async def test_api_answers_as_documented(
    children: Children, module_db_url: str, mongo_url: str
) -> None:
    seeded = await seed(module_db_url, running=20, each_other_state=20)
    _, url = await spawn(
        children,
        "api",
        module_db_url,
        EVORA_MONGO_URL=mongo_url,
        EVORA_MONGO_DB=f"fuzz_{uuid.uuid4().hex[:12]}",
    )
    prepare = real_jobs(seeded)
    report = await asyncio.to_thread(fuzz, url, ADMIN, examples=EXAMPLES, prepare=prepare)
    print(report.summary("api"))
    assert not report.failures, "\n\n".join(report.failures)
    assert report.requests >= 1500
