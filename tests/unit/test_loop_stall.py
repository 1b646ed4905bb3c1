"""worker.loop_stall: a call that holds the event loop shows as a late tick, in its bucket."""

from __future__ import annotations

import asyncio
import time

from worker.loop_stall import TICK_S, watch_loop_stalls
from worker.metrics import REGISTRY


def _late(past: str) -> float:
    """Ticks observed later than ``past`` seconds (a bucket bound, as exported: "1.0") so far."""
    total = REGISTRY.get_sample_value("sgw_event_loop_stall_seconds_count") or 0.0
    within = REGISTRY.get_sample_value("sgw_event_loop_stall_seconds_bucket", {"le": past}) or 0.0
    return total - within


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a parse on the loop does


def test_a_held_loop_is_one_late_tick_and_a_free_loop_none() -> None:
    async def scenario() -> tuple[float, float, float]:
        stop = asyncio.Event()
        watch = asyncio.create_task(watch_loop_stalls(stop))
        await asyncio.sleep(3 * TICK_S)
        free = _late("0.25")
        _hold_the_loop(0.6)
        await asyncio.sleep(2 * TICK_S)
        held = _late("0.5")
        stop.set()
        await watch
        return free, held, _late("1.0")

    before = _late("0.25"), _late("0.5"), _late("1.0")
    free, held, past_a_second = asyncio.run(scenario())
    assert free - before[0] == 0
    assert held - before[1] == 1
    assert past_a_second - before[2] == 0
