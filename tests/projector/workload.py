"""A mixed workload through the real store: completions, retries, non-retryable failures,
abandoned leases, releases, cancels, DLQ retries. Deterministic for a seed."""

from __future__ import annotations

import random

import asyncpg

from evora.protocol.jobs import JobSubmission
from evora.storage.jobs import Completion, Failure, JobStore


async def mixed_workload(
    store: JobStore,
    pool: asyncpg.Pool,
    *,
    jobs: int,
    queues: list[str],
    seed: int = 7,
    rounds: int = 40,
) -> None:
    rng = random.Random(seed)
    for start in range(0, jobs, 1000):
        await store.submit_batch(
            [
                JobSubmission(
                    queue=rng.choice(queues),
                    type=rng.choice(["a", "b", "c"]),
                    max_attempts=rng.choice([1, 2, 3]),
                    payload={"n": start + i},
                )
                for i in range(min(1000, jobs - start))
            ]
        )
    for _ in range(rounds):
        claimed = await store.claim(worker_id=f"w{rng.randrange(4)}", queues=queues, max_jobs=400)
        if not claimed:
            # abandoned leases run out, backed-off retries come due. The deadlines are moved
            # rather than the `clock` run ahead: this happens many times a workload, and each
            # advance would reopen the pool the callers share with their projectors.
            await pool.execute(
                "UPDATE evora.jobs SET lease_expires_at = now() - interval '1 s' WHERE state ="
                " 'RUNNING'"
            )
            while await store.expire_leases():
                pass
            moved = await pool.execute(
                "UPDATE evora.jobs SET run_at = now() WHERE state = 'PENDING' AND run_at > now()"
            )
            if moved == "UPDATE 0":
                break
            continue
        completions, failures = [], []
        for job in claimed:
            roll = rng.random()
            if roll < 0.5:
                completions.append(Completion(job["id"], job["lease_token"], {"ok": True}))
            elif roll < 0.7:
                failures.append(
                    Failure(job["id"], job["lease_token"], "flaky", "Timeout", retry_in_seconds=0)
                )
            elif roll < 0.8:
                failures.append(
                    Failure(
                        job["id"], job["lease_token"], "bad input", "ValueError", retryable=False
                    )
                )
            elif roll < 0.88:
                pass  # abandoned: its lease will run out
            elif roll < 0.94:
                await store.release(job["id"], job["lease_token"])
            else:
                await store.cancel(job["id"])
                failures.append(Failure(job["id"], job["lease_token"], "stopped"))
        await store.complete_many(completions)
        await store.fail_many(failures)
        pending = await pool.fetch("SELECT id FROM evora.jobs WHERE state = 'PENDING' LIMIT 20")
        for row in pending[: rng.randrange(3)]:
            await store.cancel(row["id"])
        dlq = await pool.fetch("SELECT id FROM evora.jobs WHERE state = 'DLQ' LIMIT 10")
        for row in dlq[: rng.randrange(3)]:
            if rng.random() < 0.5:
                await store.retry(row["id"])
            else:
                await store.discard(row["id"])
