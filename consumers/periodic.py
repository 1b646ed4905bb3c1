"""What the loops beside the trace loop share: a tick every interval until told to stop, with
one error policy, and the shape of a send (``Outputs.send``: records to topics, acknowledged)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from consumers.outage import OutageTooLong
from scoring.outbox import Record

log = structlog.get_logger(__name__)

Send = Callable[[list[Record]], Awaitable[None]]


async def every(interval_s: float, tick: Callable[[], Awaitable[object]], stop: asyncio.Event, *, name: str) -> None:
    """``tick``, then wait ``interval_s`` or until ``stop``; again until ``stop``. A tick that fails
    is logged (``name`` says whose) and the next tick tries again: what a tick does is kept in
    Redis or Kafka, so nothing is lost by waiting. An outage past its tolerance ends the loop
    (the outage rule: the worker stops, and is restarted)."""
    while not stop.is_set():
        try:
            await tick()
        except OutageTooLong:
            raise
        except Exception:
            log.exception(f"{name} failed; trying again on the next tick")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
