"""Batching of small Redis calls made once per trace or pair (done marks, ratings history, lease confirmations).

Each job submits its items and awaits a future; one flusher makes one call for everything submitted
meanwhile. The one rule: a failed call fails every future, so no job counts as finished on a failed write.
How long a batch lingers: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
    """``flush`` takes every item submitted meanwhile; it answers None (a write) or one answer
    per item, in order (``submit`` then returns its own items' answers)."""

    def __init__(self, flush: Callable[[list[T]], Awaitable[Sequence[R] | None]], *, max_items: int = 500,
                 max_wait_s: float = 0.005) -> None:
        self._flush = flush
        self._max_items = max_items
        self._max_wait_s = max_wait_s
        self._items: list[T] = []
        self._waiters: list[tuple[asyncio.Future[list[R]], int]] = []  # (future, how many items)
        self._wake = asyncio.Event()
        self._full = asyncio.Event()  # max_items submitted, or hurried: flush without lingering
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        """Start the flusher; ``submit`` starts it too, if it has not been."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        """Write what was submitted, then stop. A flush under way is finished, never cut."""
        self._closing = True
        self._wake.set()
        self._full.set()
        if self._task is not None:
            await self._task
        await self._flush_now()

    async def submit(self, items: list[T]) -> list[R]:
        """Send ``items`` with the next batch; returns once it is done, with their answers."""
        if not items:
            return []
        if self._task is None and not self._closing:
            self.start()
        waiter: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        self._items.extend(items)
        self._waiters.append((waiter, len(items)))
        self._wake.set()
        if len(self._items) >= self._max_items:
            self._full.set()
        return await waiter

    def hurry(self) -> None:
        """Flush what is pending now, without waiting out the linger."""
        if self._items:
            self._full.set()

    async def _run(self) -> None:
        while not self._closing:
            await self._wake.wait()
            # A linger collects the jobs finishing at about the same moment.
            if not self._full.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._max_wait_s)
            await self._flush_now()

    async def _flush_now(self) -> None:
        self._wake.clear()
        if not self._closing:
            self._full.clear()
        items, waiters = self._items, self._waiters
        self._items, self._waiters = [], []
        if not waiters:
            return
        try:
            answers: Sequence[Any] = await self._flush(items) or ()
        except Exception as exc:
            for w, _ in waiters:
                if not w.done():
                    w.set_exception(exc)
            return
        start = 0
        for w, count in waiters:
            if not w.done():
                w.set_result(list(answers[start:start + count]))
            start += count
