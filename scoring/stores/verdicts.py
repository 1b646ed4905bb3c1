"""The verdict cache in Redis (``scoring.verdict_cache`` says what it is; the claim's script
reads it, ``scoring.stores.claims``): this writes the verdicts just paid for, and reads them for
work that claims nothing (a dataset run, the playground).

Per project (its hash tag), one script call writes a batch's verdicts:

1. each verdict under its key, expiring after the TTL;
2. its key in the project's index (a sorted set by expiry), expired keys dropped from it;
3. past the project's most entries, the oldest leave the index and Redis - a tenant whose
   traffic never repeats fills its own share, never the server.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from scoring.frozen import frozen
from scoring.stores import keys
from scoring.stores.client import RedisClient
from scoring.stores.scripts import ScriptPipeline
from scoring.verdict_cache import MAX_ENTRY_BYTES, CachedVerdict, CachePolicy

# KEYS: the project's index. ARGV: TTL ms, most entries, the entries' key prefix, then per entry:
# its key (the index's member) and the verdict.
_STORE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl, most, prefix = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
for i = 4, #ARGV, 2 do
  redis.call('SET', prefix .. ARGV[i], ARGV[i + 1], 'PX', ttl)
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local over = redis.call('ZCARD', KEYS[1]) - most
if over > 0 then
  local oldest = redis.call('ZPOPMIN', KEYS[1], over)
  for j = 1, #oldest, 2 do redis.call('DEL', prefix .. oldest[j]) end
end
redis.call('PEXPIRE', KEYS[1], ttl)
return over
"""


@frozen
class Paid:
    """A verdict to keep: the project, its key, the verdict."""

    project_id: str
    key: str
    verdict: CachedVerdict


class VerdictStore:
    def __init__(self, redis: RedisClient, policy: CachePolicy) -> None:
        self._redis, self.policy = redis, policy
        self._store = redis.register_script(_STORE)

    async def store(self, paid: Sequence[Paid]) -> list[str]:
        """Keep the verdicts (one script call per project, one round trip); the keys kept (an
        entry over ``MAX_ENTRY_BYTES`` is not)."""
        by_project: dict[str, list[tuple[str, bytes]]] = defaultdict(list)
        for p in paid:
            entry = p.verdict.encode()
            if len(entry) <= MAX_ENTRY_BYTES:
                by_project[p.project_id].append((p.key, entry))
        if not by_project:
            return []
        async with ScriptPipeline(self._redis) as pipe:
            for project_id, entries in by_project.items():
                args: list[str | bytes | int] = [self.policy.ttl_s * 1000, self.policy.max_entries,
                                                 keys.judge_verdict(project_id, "")]
                for key, entry in entries:
                    args += [key, entry]
                pipe.script(self._store, [keys.judge_verdicts(project_id)], args)
            await pipe.execute()
        return [key for entries in by_project.values() for key, _ in entries]

    async def lookup(self, project_id: str, verdict_keys: Sequence[str]) -> dict[str, CachedVerdict]:
        """The verdicts stored for these keys of one project (one MGET), by key."""
        if not verdict_keys:
            return {}
        values = await self._redis.mget([keys.judge_verdict(project_id, key) for key in verdict_keys])
        found = {key: CachedVerdict.decode(value) for key, value in zip(verdict_keys, values, strict=True)}
        return {key: verdict for key, verdict in found.items() if verdict is not None}

    async def entries(self, project_id: str) -> int:
        """How many verdicts the project keeps (its index; expired ones until its next write)."""
        return int(await self._redis.zcard(keys.judge_verdicts(project_id)))
