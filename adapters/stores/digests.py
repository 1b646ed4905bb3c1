"""Digests in Redis: which worker sends a group's digest of a period to a channel.

A period is claimed ``pending`` by one worker (SET when absent), then marked ``sent`` once the
delivery is acknowledged. A pending claim older than ``PENDING_S`` (its worker died before the
acknowledgement) may be claimed again: the delivery goes out again under the same id, and the
webhook sender sends an id once.
"""

from __future__ import annotations

from adapters.stores import keys
from adapters.stores.client import RedisClient

PENDING_S = 30
KEPT_S = 2 * 86_400 + 3600  # longer than the longest period, so a period is never claimed twice

# KEYS: the period. ARGV: now (s), the TTL, PENDING_S. 1 if this caller sends it.
_CLAIM = """
local v = redis.call('GET', KEYS[1])
if v and (string.sub(v, 1, 8) ~= 'pending:' or tonumber(string.sub(v, 9)) > tonumber(ARGV[1]) - tonumber(ARGV[3])) then
  return 0
end
redis.call('SET', KEYS[1], 'pending:' .. ARGV[1], 'EX', ARGV[2])
return 1
"""


class DigestStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._claim = redis.register_script(_CLAIM)

    async def claim(self, group_id: str, channel: str, period: int, now: float) -> bool:
        return bool(await self._claim(keys=[keys.digest_period(group_id, channel, period)],
                                      args=[int(now), KEPT_S, PENDING_S]))

    async def settled(self, group_id: str, channel: str, period: int, now: float) -> bool:
        """Sent, or being sent by a live sender: nothing to read for it."""
        value = await self._redis.get(keys.digest_period(group_id, channel, period))
        text = value.decode() if isinstance(value, bytes) else value
        return text is not None and (not text.startswith("pending:") or int(text[8:]) > now - PENDING_S)

    async def sent(self, group_id: str, channel: str, period: int) -> None:
        await self._redis.set(keys.digest_period(group_id, channel, period), "sent", ex=KEPT_S)
