"""Claims: dedupe of (group, subject) pairs and the judge-call budget, in one Redis round trip.

A Lua script per pair, pipelined across a whole batch, decides atomically:

- the pair is already **done** (its outputs were acknowledged) or was **skipped** for budget:
  do nothing again - no budget, no second rating;
- another worker holds a live **lease** on it (e.g. after a rebalance): **busy**, wait for it
  to finish or for the lease to expire - never count it finished before;
- otherwise reserve the group's judge calls all or nothing from the project's budget window
  and take the lease (**claimed**), or, with too few calls left, mark it **exhausted**: the
  group is skipped whole, never scored on a partial panel.

The budget key is shared with online evaluators (same name, same fixed windows), and the claim
and budget keys of a project share its hash tag, so the script runs on Redis Cluster too.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis

from scoring.stores import keys

ClaimState = Literal["claimed", "done", "skipped", "busy", "exhausted"]

_CLAIM = """
local current = redis.call('GET', KEYS[1])
if current then
  if string.sub(current, 1, 5) == 'done:' then return {'done', current} end
  if string.sub(current, 1, 8) == 'skipped:' then return {'skipped', current} end
  return {'busy', current}
end
local want = tonumber(ARGV[3])
if want > 0 then
  local limit = tonumber(ARGV[4])
  local used = tonumber(redis.call('GET', KEYS[2]) or '0')
  if limit >= 0 and used + want > limit then
    redis.call('SET', KEYS[1], 'skipped:budget', 'EX', ARGV[6])
    return {'exhausted', tostring(used)}
  end
  redis.call('INCRBY', KEYS[2], want)
  redis.call('EXPIRE', KEYS[2], ARGV[5])
end
redis.call('SET', KEYS[1], 'lease:' .. ARGV[1], 'PX', ARGV[2])
return {'claimed', ''}
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == 'lease:' .. ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    project_id: str
    group_id: str
    subject_key: str  # "trace:<traceId>" or "session:<sessionId>:<turns>"
    judge_calls: int  # slots to reserve, all or nothing
    budget_limit: int | None  # calls per window; None = no budget configured (unlimited, counted)
    budget_window_s: int = 3600

    @property
    def key(self) -> str:
        return keys.dedupe_claim(self.project_id, self.group_id, self.subject_key)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    state: ClaimState
    detail: str  # the stored value for done/busy ("done:<ratingId>"), budget used when exhausted


def new_owner() -> str:
    """A token naming this worker process in leases, unique across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Claims:
    def __init__(self, redis: Redis, *, owner: str | None = None, lease_s: float = 120.0,
                 done_ttl_s: int = keys.DEDUPE_DONE_TTL_S) -> None:
        self._redis = redis
        self.owner = owner or new_owner()
        self.lease_ms = int(lease_s * 1000)
        self._done_ttl_s = done_ttl_s
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)

    async def claim_many(self, requests: list[ClaimRequest], now: float | None = None) -> list[ClaimResult]:
        """Claim every pair of a batch in one pipelined round trip."""
        if not requests:
            return []
        now = time.time() if now is None else now
        async with self._redis.pipeline(transaction=False) as pipe:
            for r in requests:
                window_start = int(now) // r.budget_window_s * r.budget_window_s
                budget_key = keys.judge_budget(r.project_id, window_start)
                limit = -1 if r.budget_limit is None else r.budget_limit
                await self._claim(keys=[r.key, budget_key],
                                  args=[self.owner, self.lease_ms, r.judge_calls, limit,
                                        r.budget_window_s * 2, self._done_ttl_s], client=pipe)
            replies = await pipe.execute()
        return [ClaimResult(state=_text(state), detail=_text(detail))  # type: ignore[arg-type]
                for state, detail in replies]

    async def mark_done(self, done: list[tuple[ClaimRequest, str]]) -> None:
        """Mark pairs done with their rating ids, once their outputs are acknowledged."""
        if not done:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for request, rating_id in done:
                pipe.set(request.key, f"done:{rating_id}", ex=self._done_ttl_s)
            await pipe.execute()

    async def release(self, requests: list[ClaimRequest]) -> None:
        """Give up leases this worker still holds (shutdown with work unfinished), so another
        worker need not wait for them to expire."""
        if not requests:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for r in requests:
                await self._release(keys=[r.key], args=[self.owner], client=pipe)
            await pipe.execute()

    async def budget_used(self, project_id: str, window_s: int, now: float | None = None) -> int:
        now = time.time() if now is None else now
        value = await self._redis.get(keys.judge_budget(project_id, int(now) // window_s * window_s))
        return int(value or 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
