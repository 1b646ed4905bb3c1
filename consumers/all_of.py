"""``all_of``: awaiting several steps as one, where a step's failure must not cut the others short."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def all_of(*steps: Awaitable[T]) -> list[T]:
    """Await every step; their values in order, or the first failure once all have ended. Unlike
    ``gather``, one step's failure or cancellation never returns before the others have ended: a
    cancelled job's pairs have all given their leases back by the time the job counts as over.
    """
    tasks = [asyncio.ensure_future(step) for step in steps]
    if not tasks:
        return []
    cancelled = False
    while True:
        try:
            await asyncio.wait(tasks)
            break
        except asyncio.CancelledError:  # (again, if cancelled again while the steps unwind)
            cancelled = True
            for task in tasks:
                task.cancel()
    for task in tasks:  # every failure retrieved: the first is raised below, none is logged as lost
        if not task.cancelled():
            task.exception()
    if cancelled:
        raise asyncio.CancelledError
    return [task.result() for task in tasks]
