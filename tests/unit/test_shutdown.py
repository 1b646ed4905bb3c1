"""A shutdown always ends: a client stuck closing is left behind, and the watchdog ends a
shutdown that overran its deadline, saying where each task waits."""

from __future__ import annotations

import asyncio
import time

from worker.shutdown import ShutdownWatchdog, close_all, end_tasks, where_waiting


async def test_a_client_stuck_closing_does_not_keep_the_others_open() -> None:
    closed: list[str] = []

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def fails() -> None:
        raise ConnectionError("broker gone")

    async def closes(name: str) -> None:
        closed.append(name)

    await close_all([("consumer", hangs()), ("producer", closes("producer")), ("sandbox", fails()),
                     ("redis", closes("redis"))], timeout_s=0.05)
    assert sorted(closed) == ["producer", "redis"], "every client besides the stuck and the failing one is closed"


async def test_stuck_clients_share_one_bound_not_one_each() -> None:
    async def hangs() -> None:
        await asyncio.Event().wait()

    started = time.monotonic()
    await close_all([(f"consumer {n}", hangs()) for n in range(5)], timeout_s=0.3)
    assert time.monotonic() - started < 0.9, "five stuck clients took five bounds: closed in turn, not together"


async def test_a_background_loop_past_its_deadline_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def never_stops() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def stops() -> None:
        return None

    loops = [asyncio.create_task(never_stops()), asyncio.create_task(stops())]
    await end_tasks(loops, timeout_s=0.05)
    assert cancelled.is_set() and all(task.done() for task in loops)


async def test_the_watchdog_ends_an_overdue_shutdown_with_exit_code_1() -> None:
    exits: list[int] = []
    fired = asyncio.Event()

    def exit(code: int) -> None:
        exits.append(code)
        fired.set()

    watchdog = ShutdownWatchdog(0.05, exit=exit)
    watchdog.arm()
    watchdog.arm()  # a second request does not restart the countdown nor add a second one
    await asyncio.wait_for(fired.wait(), 10)
    await asyncio.sleep(0.1)
    assert exits == [1]


async def test_a_disarmed_watchdog_never_fires() -> None:
    exits: list[int] = []
    watchdog = ShutdownWatchdog(0.01, exit=exits.append)
    watchdog.arm()
    watchdog.disarm()
    await asyncio.sleep(0.1)  # ten times its deadline
    assert exits == []


async def test_where_a_stuck_task_waits_names_the_innermost_await() -> None:
    release = asyncio.Event()

    async def leave_group() -> None:
        await release.wait()

    async def stopping_consumer() -> None:
        await leave_group()

    task = asyncio.create_task(stopping_consumer(), name="shutdown")
    await asyncio.sleep(0)
    where = where_waiting(task)
    release.set()
    await task
    assert where.startswith("shutdown: ")
    assert where.index("stopping_consumer") < where.index("leave_group") < where.index("Event.wait"), where
    assert "test_shutdown.py:" in where, "each step names its file and line"
