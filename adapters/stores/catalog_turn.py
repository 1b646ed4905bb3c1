"""The catalog's write turn across processes: one process of the fleet writes at a time, in the order they asked.

Held in Redis under a lease, above each process's own turns (``SnapshotCache.write_turns``): ask
(``_TAKE``), ask again every ``POLL_S`` up to ``WAIT_S`` (then 429), write and give it back (``_GIVE``).
The one rule: the turn is for fairness and throughput, not correctness - every write is still a WATCHed
transaction. The steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

from redis.commands.core import AsyncScript

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import NOW_MS
from scoring.errors import TooMany

POLL_S = 0.005
WAIT_S = 10.0

# KEYS: the turn, the queue (by arrival), the waiters' last asks. ARGV: this process, the lease
# (ms), how long a waiter may stay silent (ms). Returns 1 when the turn is this process's.
_TAKE = NOW_MS + """
local me, lease, gone = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local left = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - gone, 'LIMIT', 0, 100)
for _, waiter in ipairs(left) do
  redis.call('ZREM', KEYS[2], waiter)
  redis.call('ZREM', KEYS[3], waiter)
end
redis.call('ZADD', KEYS[2], 'NX', now, me)
redis.call('ZADD', KEYS[3], now, me)
redis.call('PEXPIRE', KEYS[2], gone * 2)
redis.call('PEXPIRE', KEYS[3], gone * 2)
local holder = redis.call('GET', KEYS[1])
if holder == me then return 1 end
if holder or redis.call('ZRANGE', KEYS[2], 0, 0)[1] ~= me then return 0 end
redis.call('SET', KEYS[1], me, 'PX', lease)
redis.call('ZREM', KEYS[2], me)
redis.call('ZREM', KEYS[3], me)
return 1
"""

# KEYS: as _TAKE's. ARGV: this process. Gives the turn back if it is still this process's, and
# leaves the queue (a waiter that gave up).
_GIVE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""

_KEYS = [keys.CATALOG_TURN, keys.CATALOG_TURN_QUEUE, keys.CATALOG_TURN_SEEN]


class CatalogTurn:
    """The fleet's write turn, as one process takes it (one per process: ``SnapshotCache``, whose
    writes all go through one Redis client)."""

    def __init__(self, wait_s: float = WAIT_S) -> None:
        self.name = uuid.uuid4().hex
        self.wait_s = wait_s
        self._take: AsyncScript | None = None
        self._give: AsyncScript | None = None

    @contextlib.asynccontextmanager
    async def held(self, redis: RedisClient) -> AsyncIterator[None]:
        if self._take is None or self._give is None:
            self._take, self._give = redis.register_script(_TAKE), redis.register_script(_GIVE)
        take, give = self._take, self._give
        deadline = time.monotonic() + self.wait_s
        try:
            while not await take(_KEYS, [self.name, keys.CATALOG_TURN_LEASE_MS, keys.CATALOG_TURN_GONE_MS]):
                if time.monotonic() >= deadline:
                    raise TooMany(f"the catalog's writes of every API process waited {self.wait_s:g}s "
                                  "for their turn; try again")
                await asyncio.sleep(POLL_S)
            yield
        finally:
            with contextlib.suppress(Exception):  # a lost give-back is the lease's to end
                await asyncio.shield(give(_KEYS, [self.name]))
