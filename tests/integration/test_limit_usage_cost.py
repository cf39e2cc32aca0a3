"""A page of the keys a prefix limit governs costs what the page costs, not what the keys
cost: with 50,000 tenants claimed under `tenant:*`, reading a page touches about a hundred
buffers, a small fraction of the buckets table."""

from __future__ import annotations

import json

import asyncpg

from evora.storage.limits import (
    GOVERNED_KEYS,
    PREFIX_USAGE,
    THROTTLED_COUNTED,
    USAGE_BY_KIND,
    LimitSpec,
    LimitStore,
    Rate,
)

# The size only has to put a read of every bucket, or a probe of each, far above the bounds:
# at 200,000 inserting the buckets was most of this file's time. Measured at 50,000 (at
# 200,000): a page read 109 buffers against 1,103 pages of buckets (109 against 4,412); the
# usages per kind and of tenant:* 664 and 372 against 562 pages of buckets and their key
# (2,343 and 1,475 against 2,244), and with the probe of every bucket under the stem that
# 521519f removed the prefix usage read 300,373 (1,601,476).
TENANTS = 50_000
PAGE = 50


async def _buffers(pool: asyncpg.Pool, *args: object, statement: str = GOVERNED_KEYS) -> int:
    plan = await pool.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}", *args)
    # the pool decodes json itself
    top = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


async def test_a_page_of_keys_reads_a_small_part_of_millions(pool: asyncpg.Pool) -> None:
    limits = LimitStore(pool)
    await limits.put("tenant:*", LimitSpec(concurrency=5, rate=None))
    # what TENANTS tenants' first claims leave behind (and an unrelated kind around them)
    await pool.execute(
        """
        INSERT INTO evora.flow_buckets (key, tokens, refilled_at)
        SELECT prefix || lpad(n::text, 6, '0'), 0, now()
        FROM generate_series(1, $1) AS n, unnest(ARRAY['api:', 'tenant:', 'zone:']) AS prefix
        """,
        TENANTS,
    )
    await pool.execute("ANALYZE evora.flow_buckets")
    table_pages = await pool.fetchval(
        "SELECT pg_relation_size('evora.flow_buckets') / current_setting('block_size')::int"
    )

    middle = f"tenant:{TENANTS // 2:06}"
    page = await limits.governed_keys("tenant:*", after=middle, limit=PAGE)
    assert [k.key for k in page.keys] == [
        f"tenant:{n:06}" for n in range(TENANTS // 2 + 1, TENANTS // 2 + 1 + PAGE)
    ]
    assert page.next_after == page.keys[-1].key
    last = await limits.governed_keys("tenant:*", after=f"tenant:{TENANTS - 2:06}", limit=PAGE)
    assert [k.key for k in last.keys] == [f"tenant:{TENANTS - 1:06}", f"tenant:{TENANTS:06}"]
    assert last.next_after is None

    args = ("tenant:*", "tenant:", middle, PAGE + 1, 5, None, None, THROTTLED_COUNTED)
    read = await _buffers(pool, *args)
    print(f"a page of {PAGE} keys read {read} buffers; the buckets table has {table_pages} pages")
    # measured: see TENANTS
    assert read < 200 < table_pages


async def test_the_usages_summed_over_keys_read_the_buckets_once_not_a_probe_each(
    pool: asyncpg.Pool,
) -> None:
    """The metrics' usage per kind (every scrape) and a prefix limit's usage look at the keys
    that may have no room only: with TENANTS tenants claimed under `tenant:*` an hour ago
    (their buckets refilled since), each reads the buckets once, not a probe per bucket (what
    they read with every bucket probed: ~1 buffer or more each)."""
    await LimitStore(pool).put("tenant:*", LimitSpec(concurrency=5, rate=Rate(10, 1.0)))
    await pool.execute(
        """
        INSERT INTO evora.flow_buckets (key, tokens, refilled_at)
        SELECT 'tenant:' || lpad(n::text, 6, '0'), 0, now() - interval '1 hour'
        FROM generate_series(1, $1) AS n
        """,
        TENANTS,
    )
    await pool.execute("ANALYZE evora.flow_buckets")
    pages = await pool.fetchval(
        "SELECT (pg_relation_size('evora.flow_buckets')"
        " + pg_relation_size('evora.flow_buckets_pkey')) / current_setting('block_size')::int"
    )
    read = {
        "usage by kind": await _buffers(pool, THROTTLED_COUNTED, statement=USAGE_BY_KIND),
        "usage of tenant:*": await _buffers(
            pool, "tenant:", 5, 10, 1.0, THROTTLED_COUNTED, statement=PREFIX_USAGE
        ),
    }
    print(f"read {read}; the buckets and their key have {pages} pages")
    # measured: see the record (docs/benchmarks/2026-11-29-backlog-readers.md)
    assert {n: r for n, r in read.items() if r > pages + 200} == {}
