"""What the loops beside the trace loop share: a tick every interval until told to stop, and
the shape of a send (``Outputs.send``: records to topics, acknowledged)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from scoring.outbox import Record

Send = Callable[[list[Record]], Awaitable[None]]


async def every(interval_s: float, tick: Callable[[], Awaitable[None]], stop: asyncio.Event) -> None:
    """``tick``, then wait ``interval_s`` or until ``stop``; again until ``stop``."""
    while not stop.is_set():
        await tick()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
