"""The fair-share rule of every grading pool (scoring.members.fair_share): a cap per project with
slots kept back, first come first served within a project, and a freed slot to the waiting
project that holds the fewest."""

from __future__ import annotations

import asyncio

import pytest

from scoring.members.fair_share import FairShare, default_share


def test_the_default_cap_keeps_a_sixteenth_back_and_at_least_one_slot() -> None:
    assert [default_share(n) for n in (1, 2, 16, 17, 64, 256)] == [1, 1, 15, 15, 60, 240]


async def test_a_busy_project_leaves_a_slot_free_for_a_newcomer() -> None:
    pool = FairShare(16)
    for _ in range(15):
        await pool.acquire("a")
    a_more = asyncio.ensure_future(pool.acquire("a"))  # over A's cap: waits
    await asyncio.sleep(0)
    assert not a_more.done()
    await asyncio.wait_for(pool.acquire("b"), 0.1)  # B at once: the slot kept back
    assert (pool.held("a"), pool.held("b"), pool.in_use) == (15, 1, 16)
    a_more.cancel()


async def test_a_freed_slot_goes_to_the_waiting_project_holding_the_fewest() -> None:
    pool = FairShare(4, per_project=4)
    for _ in range(4):
        await pool.acquire("a")
    order: list[str] = []

    async def want(project: str) -> None:
        await pool.acquire(project)
        order.append(project)

    waiters = [asyncio.ensure_future(want(p)) for p in ("a", "a", "b", "c")]
    await asyncio.sleep(0)
    for _ in range(3):
        pool.release("a")
        await asyncio.sleep(0)
    # A queued first, but B and C hold none: they go before A's second and third calls.
    assert order == ["b", "c", "a"]
    assert (pool.held("a"), pool.held("b"), pool.held("c")) == (2, 1, 1)
    for task in waiters:
        task.cancel()


async def test_within_a_project_callers_are_served_in_order_and_none_jumps_the_queue() -> None:
    pool = FairShare(1)
    await pool.acquire("a")
    order: list[int] = []

    async def want(n: int) -> None:
        await pool.acquire("a")
        order.append(n)
        pool.release("a")

    tasks = [asyncio.ensure_future(want(n)) for n in range(5)]
    await asyncio.sleep(0)
    pool.release("a")
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3, 4] and pool.in_use == 0


async def test_a_cancelled_waiter_gives_up_its_turn_and_a_granted_one_hands_its_slot_on() -> None:
    pool = FairShare(1)
    await pool.acquire("a")
    cancelled = asyncio.ensure_future(pool.acquire("b"))
    later = asyncio.ensure_future(pool.acquire("c"))
    await asyncio.sleep(0)
    cancelled.cancel()
    pool.release("a")  # b's turn was cancelled while waiting: c gets the slot
    await asyncio.wait_for(later, 0.1)
    assert pool.held("c") == 1 and pool.held("b") == 0
    granted_then_cancelled = asyncio.ensure_future(pool.acquire("d"))
    await asyncio.sleep(0)
    pool.release("c")  # d is granted ...
    granted_then_cancelled.cancel()  # ... and cancelled before it ran
    with pytest.raises(asyncio.CancelledError):
        await granted_then_cancelled
    assert pool.in_use == 0, "the slot granted to a cancelled caller came back"


async def test_closing_fails_every_waiter_and_every_later_caller() -> None:
    pool = FairShare(1, closed=lambda: LookupError("closed"))
    await pool.acquire("a")
    waiter = asyncio.ensure_future(pool.acquire("b"))
    await asyncio.sleep(0)
    pool.close()
    with pytest.raises(LookupError):
        await waiter
    with pytest.raises(LookupError):
        await pool.acquire("c")
