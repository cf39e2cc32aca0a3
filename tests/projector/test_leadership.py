"""The leadership loop that runs the projector (and the sweeper) must outlive whatever its
lock connection throws while connecting: a replica whose loop ended would never lead again."""

from __future__ import annotations

import asyncio
from typing import get_args

from evora.storage.leadership import AdvisoryLeader
from tests.pgproxy import Fault, FaultyProxy

KEY = 0x7E57


async def test_leader_connects_through_every_kind_of_spoilt_connection(db_url: str) -> None:
    proxy = FaultyProxy(db_url)
    via_proxy = await proxy.start()
    led = asyncio.Event()

    async def lead(ended: asyncio.Event) -> None:
        led.set()
        await ended.wait()

    leader = AdvisoryLeader(via_proxy, KEY, name="evora-test-leader", standby_seconds=0.1)
    stop = asyncio.Event()
    faults = [(fault, 2) for fault in get_args(Fault)]  # at the startup message
    try:
        proxy.fault_next = faults[0]
        running = asyncio.create_task(leader.run(lead, stop))
        for done, fault in enumerate(faults[1:], start=1):
            while proxy.faults < done:  # the previous connection was spoilt...
                assert not running.done(), running
                await asyncio.sleep(0.01)
            proxy.fault_next = fault  # ...and so will the next one be
        leading = asyncio.ensure_future(led.wait())
        await asyncio.wait({leading, running}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        leading.cancel()
        assert not running.done(), running
        assert led.is_set() and proxy.faults == len(faults)
        stop.set()
        await asyncio.wait_for(running, 30)
    finally:
        proxy.close()
