"""Batching of small Redis writes that finish each trace (done marks, ratings history).

Jobs finish one by one; writing for each would cost a round trip per trace. Each job submits
its items and awaits a future; one flusher writes everything submitted meanwhile in one call,
then resolves the futures (or fails them, so no job counts as finished on a failed write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Batcher(Generic[T]):
    def __init__(self, flush: Callable[[list[T]], Awaitable[None]], *, max_items: int = 500,
                 max_wait_s: float = 0.005) -> None:
        self._flush = flush
        self._max_items = max_items
        self._max_wait_s = max_wait_s
        self._items: list[T] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="batcher")

    async def stop(self) -> None:
        """Write what was submitted, then stop. A flush under way is finished, never cut."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
        await self._flush_now()

    async def submit(self, items: list[T]) -> None:
        """Write ``items`` with the next batch; returns once they are written."""
        if not items:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._items.extend(items)
        self._waiters.append(waiter)
        self._wake.set()
        await waiter

    async def _run(self) -> None:
        while not self._closing:
            await self._wake.wait()
            # A short linger collects the jobs finishing at about the same moment.
            if len(self._items) < self._max_items:
                await asyncio.sleep(self._max_wait_s)
            await self._flush_now()

    async def _flush_now(self) -> None:
        self._wake.clear()
        items, waiters = self._items, self._waiters
        self._items, self._waiters = [], []
        if not waiters:
            return
        try:
            await self._flush(items)
        except Exception as exc:
            for w in waiters:
                if not w.done():
                    w.set_exception(exc)
        else:
            for w in waiters:
                if not w.done():
                    w.set_result(None)
