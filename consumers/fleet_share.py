"""Which background work this worker does: the groups and projects of the shards it holds
(``adapters.stores.shards``). Incident watches, digests and the session sweep each ask
``owns(group or project id)`` and skip the rest, so a fleet of N workers does each piece once,
each worker about 1/N of it, instead of every worker all of it.

Renewed every third of the lease: a worker that dies loses its shards within a lease, and a
worker that joins gets its share within one renewal of the others. A stopping worker gives its
shards back at once.
"""

from __future__ import annotations

import asyncio
import functools

import structlog

from adapters.stores.keys import SHARDS, shard_of
from adapters.stores.shards import ShardLeases
from consumers.periodic import every

log = structlog.get_logger(__name__)

DEFAULT_LEASE_S = 15.0


class FleetShare:
    def __init__(self, leases: ShardLeases | None, worker: str, lease_s: float = DEFAULT_LEASE_S) -> None:
        self._leases, self._worker, self._lease_s = leases, worker, lease_s
        # Without leases (a worker alone, a test), this worker does all of it.
        self.shards: frozenset[int] = frozenset(range(SHARDS)) if leases is None else frozenset()

    @classmethod
    def everything(cls) -> FleetShare:
        return cls(None, "alone")

    def owns(self, key: str) -> bool:
        """Is the background work of this group or project id this worker's?"""
        return _shard(key) in self.shards

    async def renew(self) -> None:
        if self._leases is None:
            return
        try:
            held = await self._leases.renew(self._worker, self._lease_s)
        except Exception:  # Redis away: keep what we had (the work needs Redis anyway); at worst done twice
            log.warning("renewing the fleet's shard leases failed; keeping the last", exc_info=True)
            return
        if held != self.shards:
            log.info("background work shards changed", held=len(held), gained=len(held - self.shards),
                     lost=len(self.shards - held))
        self.shards = held

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await every(self._lease_s / 3, self.renew, stop, name="renewing the fleet's shard leases")
        finally:
            if self._leases is not None:
                try:
                    await self._leases.leave(self._worker)
                except Exception:  # they end with their lease
                    log.warning("giving the fleet's shard leases back failed", exc_info=True)


@functools.lru_cache(maxsize=1 << 17)
def _shard(key: str) -> int:
    return shard_of(key)
