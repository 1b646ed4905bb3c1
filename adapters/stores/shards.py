"""The fleet's share of background work: ``SHARDS`` leases in Redis, split evenly among the workers that renew them.

One script call per renewal (``renew``) drops members past their lease, keeps and takes shards up to the
fair share, lowest first, and renews them. The one rule: Redis's clock, never a worker's, decides who holds
a shard; a shard held twice for a moment costs only work done twice. The steps: docs/design-notes.md.
"""

from __future__ import annotations

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import NOW_MS

_HOLD = NOW_MS + """
local worker, lease, shards = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + lease, worker)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local fair = math.ceil(shards / redis.call('ZCARD', KEYS[1]))
local held = redis.call('HGETALL', KEYS[2])
local owner = {}
for i = 1, #held, 2 do
  local who, ends = string.match(held[i + 1], '^(.*) (%d+)$')
  if who and tonumber(ends) > now then owner[tonumber(held[i])] = who end
end
local mine = {}
for s = 0, shards - 1 do
  if owner[s] == worker then
    if #mine < fair then mine[#mine + 1] = s else redis.call('HDEL', KEYS[2], s) end
  end
end
for s = 0, shards - 1 do
  if #mine >= fair then break end
  if owner[s] == nil then mine[#mine + 1] = s end
end
for _, s in ipairs(mine) do redis.call('HSET', KEYS[2], s, worker .. ' ' .. (now + lease)) end
redis.call('PEXPIRE', KEYS[1], lease * 4)
redis.call('PEXPIRE', KEYS[2], lease * 4)
return mine
"""

_LEAVE = """
redis.call('ZREM', KEYS[1], ARGV[1])
local held = redis.call('HGETALL', KEYS[2])
for i = 1, #held, 2 do
  if string.match(held[i + 1], '^(.*) %d+$') == ARGV[1] then redis.call('HDEL', KEYS[2], held[i]) end
end
return 0
"""


class ShardLeases:
    def __init__(self, redis: RedisClient) -> None:
        self._hold = redis.register_script(_HOLD)
        self._leave = redis.register_script(_LEAVE)

    async def renew(self, worker: str, lease_s: float) -> frozenset[int]:
        """Renew ``worker``'s membership and leases (the steps above); the shards it holds."""
        held = await self._hold(keys=[keys.FLEET_MEMBERS, keys.FLEET_LEASES],
                                args=[worker, int(lease_s * 1000), keys.SHARDS])
        return frozenset(int(s) for s in held)

    async def leave(self, worker: str) -> None:
        """Give every lease back at once (a stopping worker): the others take them at their next
        renewal instead of after the lease."""
        await self._leave(keys=[keys.FLEET_MEMBERS, keys.FLEET_LEASES], args=[worker])
