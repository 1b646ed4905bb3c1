"""What the commands share: a client on the Redis catalog, its refusals said one line per field."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

from scoring.errors import CatalogError
from services.groups import MonitorClient
from worker.connections import redis_client
from worker.settings import Settings


def with_client(settings: Settings, action: Callable[[MonitorClient], Awaitable[int]]) -> int:
    async def go() -> int:
        redis = redis_client(settings)
        try:
            return await action(MonitorClient(redis))
        finally:
            await redis.aclose()

    try:
        return asyncio.run(go())
    except CatalogError as exc:
        print(f"error ({exc.status}):", file=sys.stderr)
        for line in exc.errors:
            print(f"  - {line}", file=sys.stderr)
        return 2
