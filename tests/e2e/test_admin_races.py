"""Operators and workers racing each other over real HTTP: limits, schedules and queue pauses
changed and removed while producers submit (some with the same idempotency keys), workers
claim, heartbeat, release and ack (some with stale tokens), and admins cancel, retry,
discard and redrive the same jobs. Whatever the interleaving, no request is answered 5xx,
every job a producer was given exists, and the jobs keep the state machine's invariants."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from typing import Any
from uuid import uuid4

import aiohttp
import asyncpg
import orjson

from tests.servers import ADMIN_TOKEN, PRODUCER_TOKEN, WORKER_TOKEN, Services

QUEUE = "races"
# A longer or different run hunts for rarer interleavings: RACE_ROUNDS=150 RACE_SEED=7.
ROUNDS = int(os.environ.get("RACE_ROUNDS", "30"))
SEED = int(os.environ.get("RACE_SEED", "20261128"))
LIMIT_KEYS = ("tenant:*", "tenant:1", "api:x", f"queue:{QUEUE}")
SCHEDULES = ("nightly", "hourly")


class Calls:
    """Every call made, by what it was and how it was answered; the 5xx ones kept whole."""

    def __init__(self, http: aiohttp.ClientSession, services: Services) -> None:
        self.http = http
        self.api = services.api.url
        self.dispatcher = services.dispatcher.url
        self.seen: Counter[tuple[str, int]] = Counter()
        self.failed: list[tuple[str, int, bytes]] = []
        self.ack_items: Counter[int] = Counter()  # the status of each ack in a batch

    async def __call__(
        self, what: str, method: str, url: str, token: str, body: Any = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token}"}
        async with self.http.request(method, url, json=body, headers=headers) as response:
            raw = await response.read()
        self.seen[(what, response.status)] += 1
        if response.status >= 500:
            self.failed.append((what, response.status, raw))
        return response.status, orjson.loads(raw) if raw else None

    def succeeded(self, what: str) -> int:
        return sum(n for (w, status), n in self.seen.items() if w == what and status < 300)


async def _limits(call: Calls, rng: random.Random) -> None:
    for _ in range(ROUNDS):
        key = rng.choice(LIMIT_KEYS)
        match rng.randrange(3):
            case 0:
                rate = (
                    {"limit": rng.randint(1, 50), "per_seconds": 1} if rng.random() < 0.5 else None
                )
                body = {"concurrency": rng.choice([None, 1, 3, 20]), "rate": rate}
                if body["concurrency"] is None and rate is None:
                    body["concurrency"] = 5
                await call("put limit", "PUT", f"{call.api}/v1/limits/{key}", ADMIN_TOKEN, body)
            case 1:
                await call("delete limit", "DELETE", f"{call.api}/v1/limits/{key}", ADMIN_TOKEN)
            case _:
                usage = "tenant:2" if key == "tenant:*" else key
                await call("get limit", "GET", f"{call.api}/v1/limits/{usage}", ADMIN_TOKEN)


async def _schedules(call: Calls, rng: random.Random) -> None:
    for _ in range(ROUNDS):
        url = f"{call.api}/v1/schedules/{rng.choice(SCHEDULES)}"
        match rng.randrange(5):
            case 0:
                body = {
                    "cron": rng.choice(["*/5 * * * *", "@hourly"]),
                    "job": {"queue": QUEUE, "type": "scheduled", "limit_keys": ["api:x"]},
                    "misfire": rng.choice(["skip", "run_once"]),
                }
                await call("put schedule", "PUT", url, ADMIN_TOKEN, body)
            case 1:
                await call("delete schedule", "DELETE", url, ADMIN_TOKEN)
            case 2:
                await call("trigger schedule", "POST", url + "/trigger", ADMIN_TOKEN)
            case 3:
                action = rng.choice(["pause", "resume"])
                await call(f"{action} schedule", "POST", f"{url}/{action}", ADMIN_TOKEN)
            case _:
                await call("get schedule", "GET", url, ADMIN_TOKEN)


async def _pauses(call: Calls, rng: random.Random) -> None:
    for _ in range(ROUNDS):
        action = rng.choice(["pause", "resume"])
        await call(f"{action} queue", "POST", f"{call.api}/v1/queues/{QUEUE}/{action}", ADMIN_TOKEN)


async def _producer(call: Calls, rng: random.Random, given: set[str]) -> None:
    for round_ in range(ROUNDS):
        jobs = []
        for i in range(rng.randint(1, 20)):
            job: dict[str, Any] = {
                "queue": QUEUE,
                "type": "work",
                "payload": {"i": i},
                "max_attempts": rng.randint(1, 2),
                "limit_keys": rng.sample(["tenant:1", "tenant:2", "api:x"], rng.randint(0, 2)),
            }
            if rng.random() < 0.2:
                job["group_key"] = rng.choice(["g1", "g2"])
            if rng.random() < 0.3:
                # the other producers use the same keys with the same fields: one job each
                job.pop("group_key", None)
                job.update(idempotency_key=f"k{round_}-{i}", max_attempts=1, limit_keys=[])
            jobs.append(job)
        status, answer = await call(
            "submit", "POST", f"{call.api}/v1/jobs/batch", PRODUCER_TOKEN, {"jobs": jobs}
        )
        if status == 200:
            given.update(entry["job"]["id"] for entry in answer["jobs"])


async def _worker(call: Calls, rng: random.Random, name: str) -> None:
    for _ in range(ROUNDS):
        body = {"worker_id": name, "queues": [QUEUE], "max_jobs": 10, "wait_seconds": 0}
        status, answer = await call(
            "claim", "POST", f"{call.dispatcher}/v1/claim", WORKER_TOKEN, body
        )
        if status != 200:
            continue
        acks = []
        for job in answer["jobs"]:
            token = job["lease_token"] if rng.random() < 0.8 else str(uuid4())  # some stale
            url = f"{call.dispatcher}/v1/jobs/{job['id']}"
            match rng.randrange(6):
                case 0:
                    await call(
                        "heartbeat",
                        "POST",
                        url + "/heartbeat",
                        WORKER_TOKEN,
                        {"lease_token": token},
                    )
                    acks.append({"id": job["id"], "lease_token": token, "outcome": "complete"})
                case 1:
                    await call(
                        "release", "POST", url + "/release", WORKER_TOKEN, {"lease_token": token}
                    )
                case 2:
                    error = {"message": "boom", "retryable": rng.random() < 0.5}
                    acks.append(
                        {"id": job["id"], "lease_token": token, "outcome": "fail", "error": error}
                    )
                case _:
                    acks.append({"id": job["id"], "lease_token": token, "outcome": "complete"})
        if acks:
            status, answer = await call(
                "acks", "POST", f"{call.dispatcher}/v1/acks", WORKER_TOKEN, {"acks": acks}
            )
            if status == 200:
                call.ack_items.update(item["status"] for item in answer["results"])


async def _admin(call: Calls, rng: random.Random) -> None:
    for _ in range(ROUNDS):
        # the dead-lettered jobs to retry or discard, the live ones to cancel
        state, actions = rng.choice([("DLQ", ("retry", "discard")), ("RUNNING", ("cancel",))])
        status, listed = await call(
            "list jobs",
            "GET",
            f"{call.api}/v1/jobs?queue={QUEUE}&state={rng.choice([state, 'PENDING'])}&limit=20",
            ADMIN_TOKEN,
        )
        ids = [job["id"] for job in listed["jobs"]] if status == 200 else []
        for job_id in rng.sample(ids, min(len(ids), 3)):
            action = rng.choice(actions)
            token = PRODUCER_TOKEN if action == "cancel" else ADMIN_TOKEN
            await call(action, "POST", f"{call.api}/v1/jobs/{job_id}/{action}", token)
        if rng.random() < 0.3:
            await call("redrive", "POST", f"{call.api}/v1/queues/{QUEUE}/redrive", ADMIN_TOKEN, {})


async def test_operators_workers_and_producers_racing_never_get_a_5xx(
    services: Services, pool: asyncpg.Pool
) -> None:
    given: set[str] = set()
    async with aiohttp.ClientSession() as http:
        call = Calls(http, services)
        rng = random.Random(SEED)
        actors = [
            *(_limits(call, random.Random(rng.random())) for _ in range(3)),
            *(_schedules(call, random.Random(rng.random())) for _ in range(3)),
            *(_pauses(call, random.Random(rng.random())) for _ in range(2)),
            *(_producer(call, random.Random(rng.random()), given) for _ in range(3)),
            *(_worker(call, random.Random(rng.random()), f"w{n}") for n in range(3)),
            *(_admin(call, random.Random(rng.random())) for _ in range(2)),
        ]
        await asyncio.gather(*actors)

    assert call.failed == [], call.failed
    # The run did what it claims: each kind of operation succeeded at least once.
    for what in (
        "put limit",
        "delete limit",
        "put schedule",
        "delete schedule",
        "trigger schedule",
        "pause queue",
        "resume queue",
        "submit",
        "claim",
        "acks",
        "cancel",
        "list jobs",
    ):
        assert call.succeeded(what) > 0, (what, call.seen)
    # Owners' acks were settled and strangers' (stale tokens) refused, job by job.
    assert call.ack_items[200] > 0 and call.ack_items[409] > 0, call.ack_items
    rows = await pool.fetch("SELECT id::text, state::text FROM evora.jobs WHERE queue = $1", QUEUE)
    stored = {row["id"] for row in rows}
    assert given <= stored  # every job a producer was given exists
    # Each job's events chain (every change starts from the state the last one left) and end
    # in the job's state: no change was lost or applied twice.
    broken = await pool.fetch(
        """
        SELECT job_id, job_version, from_state::text, to_state::text, prev, state::text
        FROM (SELECT e.*, j.state,
                     lag(e.to_state) OVER (PARTITION BY e.job_id ORDER BY e.job_version) AS prev,
                     row_number() OVER (PARTITION BY e.job_id ORDER BY e.job_version DESC)
                         AS back
              FROM evora.job_events e JOIN evora.jobs j ON j.id = e.job_id
              WHERE j.queue = $1) AS x
        WHERE prev IS DISTINCT FROM from_state OR (back = 1 AND to_state <> state)
        """,
        QUEUE,
    )
    assert [dict(row) for row in broken] == []
    # Idempotent submissions raced by three producers made one job per key.
    keys = await pool.fetchval(
        "SELECT count(*) - count(DISTINCT idempotency_key) FROM evora.jobs "
        "WHERE queue = $1 AND idempotency_key LIKE 'k%'",
        QUEUE,
    )
    assert keys == 0
