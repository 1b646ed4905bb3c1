"""Digests in Redis: which worker sends a group's digest of a period to a channel.

A period is claimed ``pending`` by one worker, dated by Redis's clock, then marked ``sent`` once
the delivery is acknowledged. A pending claim older than ``PENDING_S`` (its worker died before the
acknowledgement) may be claimed again: the delivery goes out again under the same id, and the
webhook sender sends an id once.
"""

from __future__ import annotations

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import NOW_MS

PENDING_S = 30
KEPT_S = 2 * 86_400 + 3600  # longer than the longest period, so a period is never claimed twice

# KEYS: the period. ARGV: PENDING_S. A live claim is "pending:<Redis's seconds>".
_LIVE = NOW_MS + """
local v = redis.call('GET', KEYS[1])
local live = v and (string.sub(v, 1, 8) ~= 'pending:' or tonumber(string.sub(v, 9)) * 1000 > now - ARGV[1] * 1000)
"""

# 1 when the period is sent or a live sender has it.
_SETTLED = _LIVE + """
if live then return 1 end
return 0
"""

# ARGV: PENDING_S, the TTL. 1 if this caller sends it (none sent it, none live has it).
_CLAIM = _LIVE + """
if live then return 0 end
redis.call('SET', KEYS[1], 'pending:' .. math.floor(now / 1000), 'EX', ARGV[2])
return 1
"""


class DigestStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._claim = redis.register_script(_CLAIM)
        self._settled = redis.register_script(_SETTLED)

    async def claim(self, group_id: str, channel: str, period: int) -> bool:
        return bool(await self._claim(keys=[keys.digest_period(group_id, channel, period)], args=[PENDING_S, KEPT_S]))

    async def settled(self, group_id: str, channel: str, period: int) -> bool:
        """Sent, or being sent by a live sender: nothing to read for it."""
        return bool(await self._settled(keys=[keys.digest_period(group_id, channel, period)], args=[PENDING_S]))

    async def sent(self, group_id: str, channel: str, period: int) -> None:
        await self._redis.set(keys.digest_period(group_id, channel, period), "sent", ex=KEPT_S)
