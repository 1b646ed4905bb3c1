"""A shutdown that always ends.

The worker stops in steps, each with a deadline; a watchdog armed when the stop is requested ends the
process with exit code 1 (logging where every task waits) if the steps have not ended by its deadline.
The one rule: nothing is lost by that, since offsets are committed only for finished work.
The steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from types import CoroutineType, GeneratorType
from typing import Any

import structlog

log = structlog.get_logger(__name__)

CLOSE_TIMEOUT_S = 10.0  # per client: closing sends at most a request or two (leave group, flush)
WATCHDOG_GRACE_S = 60.0  # beyond the drain's deadlines: every client's close, and then some


async def close_all(closers: list[tuple[str, Awaitable[Any]]], timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close every client at once, all within ``timeout_s``: the clients are independent, so the
    slowest bounds the step (in turn, seven stuck clients took seven bounds - longer than an
    orchestrator waits). A failure or a hang is logged; the others close all the same."""
    tasks = {asyncio.ensure_future(closer): name for name, closer in closers}
    if not tasks:
        return
    done, stuck = await asyncio.wait(tasks, timeout=timeout_s)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.warning("error while closing", client=tasks[task], exc_info=task.exception())
    for task in stuck:
        log.warning("a client did not close in time; left behind", client=tasks[task], timeout_s=timeout_s)
        task.cancel()


async def end_tasks(tasks: list[asyncio.Task[Any]], timeout_s: float) -> None:
    """Let ``tasks`` end within ``timeout_s``, then cancel what is left and give it
    ``CLOSE_TIMEOUT_S`` to unwind: a loop still running when its clients close would fail on
    them, and one left for the event loop's close could hold the process forever."""
    if not tasks:
        return
    _, running = await asyncio.wait(tasks, timeout=timeout_s)
    for task in running:
        log.warning("a background loop did not stop in time; cancelled", loop=task.get_name(), timeout_s=timeout_s)
        task.cancel()
    if running:
        _, stuck = await asyncio.wait(running, timeout=CLOSE_TIMEOUT_S)
        for task in stuck:
            log.warning("a background loop did not end on cancellation; left behind", where=where_waiting(task))


class ShutdownWatchdog:
    """Ends the process if a shutdown has not finished ``deadline_s`` after it was requested."""

    def __init__(self, deadline_s: float, exit: Callable[[int], object] = os._exit) -> None:
        self.deadline_s = deadline_s
        self._exit = exit
        self._timer: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """Start the countdown (again calls do not restart it: the first request counts)."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.deadline_s, self._overdue)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _overdue(self) -> None:
        log.error("shutdown overdue: exiting without finishing it", deadline_s=self.deadline_s,
                  waiting=[where_waiting(task) for task in asyncio.all_tasks()])
        sys.stdout.flush()
        sys.stderr.flush()
        self._exit(1)


def where_waiting(task: asyncio.Task[Any]) -> str:
    """``<task name>: outer -> ... -> innermost (file:line)``: the chain of awaits a task is
    suspended in, innermost last - what a stack dump of a coroutine would not show."""
    chain: list[str] = []
    awaited: Any = task.get_coro()
    while isinstance(awaited, CoroutineType | GeneratorType):
        frame = awaited.cr_frame if isinstance(awaited, CoroutineType) else awaited.gi_frame
        if frame is None:
            break
        chain.append(f"{frame.f_code.co_qualname} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})")
        awaited = awaited.cr_await if isinstance(awaited, CoroutineType) else awaited.gi_yieldfrom
    return f"{task.get_name()}: {' -> '.join(chain) or repr(awaited)}"
