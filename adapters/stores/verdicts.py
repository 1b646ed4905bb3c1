"""The verdict cache in Redis: writes the verdicts just paid for, reads them for work that claims nothing.

What it is: ``scoring.verdict_cache``; the claim's script reads it (``adapters.stores.claims``). The one
rule: a project's bucket holds at most ``per_bucket`` verdicts (a tenant fills its own share and no more),
and every verdict is kept at least the TTL. The buckets and the write: docs/design-notes.md.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import ScriptPipeline
from scoring.frozen import frozen
from scoring.verdict_cache import MAX_ENTRY_BYTES, CachedVerdict, CachePolicy

# Keeps verdicts (a flat table: key, entry, ...) in a bucket while it holds fewer than ``most``;
# the first ones fit. Returns how many were kept. (Also the done marks', ``claim_scripts``.)
KEEP_VERDICTS = """
local function keep_verdicts(bucket, most, expires_at, flat)
  local kept = math.min(math.max(most - redis.call('HLEN', bucket), 0), #flat / 2)
  for from = 1, 2 * kept, 4000 do
    redis.call('HSET', bucket, unpack(flat, from, math.min(from + 3999, 2 * kept)))
  end
  if kept > 0 then redis.call('PEXPIREAT', bucket, expires_at) end
  return kept
end
"""

# KEYS: the project's newest bucket. ARGV: its most verdicts, when it expires (ms since the epoch),
# then per verdict: its key (a field), the verdict. Returns how many were kept (the first ones).
_STORE = KEEP_VERDICTS + """
local flat = {}
for i = 3, #ARGV do flat[i - 2] = ARGV[i] end
return keep_verdicts(KEYS[1], tonumber(ARGV[1]), ARGV[2], flat)
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

    def buckets(self, project_id: str, now: float) -> list[str]:
        """The hashes a lookup of the project reads at ``now``, the newest first."""
        return [keys.judge_verdicts(project_id, bucket) for bucket in self.policy.reading(now)]

    async def store(self, paid: Sequence[Paid], now: float | None = None) -> list[str]:
        """Keep the verdicts (one script call per project, one round trip); the keys kept (an
        entry over ``MAX_ENTRY_BYTES``, or past its bucket's room, is not)."""
        by_project: dict[str, dict[str, bytes]] = defaultdict(dict)
        for p in paid:
            entry = p.verdict.encode()
            if len(entry) <= MAX_ENTRY_BYTES:
                by_project[p.project_id][p.key] = entry
        if not by_project:
            return []
        now = time.time() if now is None else now
        newest = self.policy.reading(now)[0]
        async with ScriptPipeline(self._redis) as pipe:
            for project_id, entries in by_project.items():
                args: list[str | bytes | int] = [self.policy.per_bucket, self.policy.expires_at_ms(newest)]
                for key, entry in entries.items():
                    args += [key, entry]
                pipe.script(self._store, [keys.judge_verdicts(project_id, newest)], args)
            kept = await pipe.execute()
        return [key for entries, n in zip(by_project.values(), kept, strict=True) for key in list(entries)[:int(n)]]

    async def lookup(self, project_id: str, verdict_keys: Sequence[str],
                     now: float | None = None) -> dict[str, CachedVerdict]:
        """The verdicts stored for these keys of one project (an HMGET per bucket, one round
        trip), by key."""
        if not verdict_keys:
            return {}
        async with ScriptPipeline(self._redis) as pipe:
            for bucket in self.buckets(project_id, time.time() if now is None else now):
                pipe.redis.hmget(bucket, list(verdict_keys))
            replies = await pipe.execute()
        found: dict[str, CachedVerdict] = {}
        for values in replies:  # the newest bucket first: its verdict wins
            for key, value in zip(verdict_keys, values, strict=True):
                if key not in found and (verdict := CachedVerdict.decode(value)) is not None:
                    found[key] = verdict
        return found

    async def entries(self, project_id: str, now: float | None = None) -> int:
        """How many verdicts the project keeps (the buckets a lookup reads)."""
        async with ScriptPipeline(self._redis) as pipe:
            for bucket in self.buckets(project_id, time.time() if now is None else now):
                pipe.redis.hlen(bucket)
            return sum(int(n) for n in await pipe.execute())
