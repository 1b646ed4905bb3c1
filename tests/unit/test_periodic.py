"""The one background loop: a tick every interval until told to stop; a failed tick is logged
by name and the next one tries again; an outage past its tolerance ends the loop."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from consumers.outage import OutageTooLong
from consumers.periodic import every


async def test_a_failed_tick_is_logged_by_name_and_the_next_tries_again() -> None:
    stop, ticks = asyncio.Event(), []

    async def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) == 2:
            raise ValueError("a document nobody can read")
        if len(ticks) == 4:
            stop.set()

    with capture_logs() as logs:
        await asyncio.wait_for(every(0.01, tick, stop, name="the shadow sweep"), timeout=5)
    assert ticks == [0, 1, 2, 3], "the loop went on past the failed tick, until told to stop"
    (failed,) = [e for e in logs if e["log_level"] == "error"]
    assert failed["event"] == "the shadow sweep failed; trying again on the next tick" and failed["exc_info"] is True


async def test_an_outage_past_its_tolerance_ends_the_loop() -> None:
    async def tick() -> None:
        raise OutageTooLong("redis unreachable for 121s")

    with pytest.raises(OutageTooLong):
        await asyncio.wait_for(every(0.01, tick, asyncio.Event(), name="the incident watch"), timeout=5)


async def test_a_stop_between_ticks_ends_it_at_once() -> None:
    stop, ticks = asyncio.Event(), []

    async def tick() -> None:
        ticks.append(1)
        stop.set()

    await asyncio.wait_for(every(3600, tick, stop, name="the digests' tick"), timeout=5)
    assert ticks == [1]
