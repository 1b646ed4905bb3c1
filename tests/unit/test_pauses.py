"""PauseWatch: a tick much later than asked for is a pause; a watch nobody runs sees none."""

from __future__ import annotations

import asyncio
import time

from consumers.pauses import PauseWatch


async def test_the_event_loop_standing_still_is_a_pause_seen_since_any_earlier_moment() -> None:
    watch, stop = PauseWatch(tick_s=0.01, pause_s=0.3), asyncio.Event()
    running = asyncio.create_task(watch.run(stop))
    await asyncio.sleep(0.05)
    began = time.monotonic()
    assert not watch.since(began)
    asyncio.get_running_loop().call_soon(time.sleep, 0.5)  # nothing on the loop runs meanwhile
    await asyncio.sleep(0.05)
    assert watch.since(began) and watch.pauses == 1
    assert not watch.since(time.monotonic()), "a pause that ended before is not since now"
    stop.set()
    await running


async def test_a_watch_nobody_runs_sees_no_pause() -> None:
    watch = PauseWatch(tick_s=0.01, pause_s=0.1)
    began = time.monotonic()
    await asyncio.sleep(0.2)  # no tick for longer than a pause: not a pause, nothing was watching
    assert not watch.since(began)
