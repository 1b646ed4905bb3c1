"""The durable retry schedule of webhook deliveries, kept in Redis.

A delivery read from the webhooks topic is written here before its offset is committed; claiming one moves
its due time one lease ahead. The one rule: a restart or a rebalance never loses a delivery - whichever
worker is alive claims it when it is due - and a delivered one is not sent again. The keys and the shards:
docs/design-notes.md.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, cast

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import ScriptPipeline
from scoring.results import WebhookDelivery
from scoring.webhooks.retries import RetrySchedule

AttemptOutcome = Literal["delivered", "failed", "rejected", "gone", "refused"]


class _Doc(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)


class Attempt(_Doc):
    at: datetime
    outcome: AttemptOutcome
    status: int | None = None
    error: str | None = None


class PendingDelivery(_Doc):
    delivery: WebhookDelivery
    attempts: tuple[Attempt, ...] = ()
    first_seen: datetime

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()

    def with_attempt(self, attempt: Attempt) -> PendingDelivery:
        return self.model_copy(update={"attempts": (*self.attempts, attempt)})


@dataclass(frozen=True)
class PagerDutyIncident:
    """What a delivery does to a PagerDuty channel's incident: a trigger opens, a recovery closes."""

    action: Literal["open", "close"]
    key: str  # keys.webhook_incident(...)
    # The same incident under the channel id without its project, as incidents opened before the
    # project was part of it are kept: a close resolves either. (Remove once those expired.)
    legacy_key: str


def shard_of(delivery: WebhookDelivery) -> int:
    # Deliveries written before they named their channel by key are sharded by their URL. By the
    # URL's key, not the whole channel id: a shard only spreads keys over a cluster (nothing is
    # shared or limited per shard), and records already scheduled must keep finding theirs.
    return keys.webhook_shard(delivery.channel or delivery.url)


@dataclass
class ScheduleWrites:
    """Schedule writes gathered from many attempts, sent together by ``DeliverySchedule.write``.
    Keyed by delivery id; each remembers the delivery's shard."""

    finished: dict[str, tuple[int, Literal["delivered", "dead"]]] = field(default_factory=dict)
    retries: dict[str, tuple[PendingDelivery, float]] = field(default_factory=dict)
    postponed: dict[str, tuple[int, float]] = field(default_factory=dict)

    def finish(self, delivery: WebhookDelivery, outcome: Literal["delivered", "dead"]) -> None:
        self.finished[delivery.id] = (shard_of(delivery), outcome)

    def retry(self, pending: PendingDelivery, at: float) -> None:
        self.retries[pending.delivery.id] = (pending, at)

    def postpone(self, delivery: WebhookDelivery, at: float) -> None:
        self.postponed[delivery.id] = (shard_of(delivery), at)

    def __bool__(self) -> bool:
        return bool(self.finished or self.retries or self.postponed)

    def __len__(self) -> int:
        return len(self.finished) + len(self.retries) + len(self.postponed)


# --- The store --------------------------------------------------------------------------------

# KEYS: due, created, then per delivery: pending, done, incident, its legacy key. ARGV: per
# delivery: id, document, first seen (ms), incident action ('', 'open' or 'close'); then now (ms),
# lease (ms), TTL of a pending delivery, TTL of an incident. A 'close' (a recovery) is scheduled
# only when an incident is open for it (under either key), and closes it; an 'open' opens one.
_ADD = """
local tail = #ARGV - 4
local now, lease, ttl, incident_ttl = ARGV[tail + 1], ARGV[tail + 2], ARGV[tail + 3], ARGV[tail + 4]
local added = {}
for i = 1, tail, 4 do
  local n = (i + 3) / 4
  local pending, done, incident, legacy = KEYS[4 * n - 1], KEYS[4 * n], KEYS[4 * n + 1], KEYS[4 * n + 2]
  local action = ARGV[i + 3]
  if redis.call('EXISTS', done) == 1 or redis.call('EXISTS', pending) == 1 then
    added[n] = 0
  elseif action == 'close' and redis.call('DEL', incident, legacy) == 0 then
    added[n] = 0
  else
    if action == 'open' then
      redis.call('SET', incident, '1', 'EX', incident_ttl)
    end
    redis.call('SET', pending, ARGV[i + 1], 'EX', ttl)
    redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
    redis.call('ZADD', KEYS[2], ARGV[i + 2], ARGV[i])
    added[n] = 1
  end
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
return added
"""

# KEYS: due, created, then pending:<id> per id (KEYS[i] for ARGV[i]). ARGV: now_ms, lease_ms,
# then the ids. A delivery is claimed only if still due (another worker may have claimed it
# since it was listed); one whose document expired leaves both sets.
_CLAIM = """
local now, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= now then
    local doc = redis.call('GET', KEYS[i])
    if doc then
      redis.call('ZADD', KEYS[1], now + lease, ARGV[i])
      table.insert(out, doc)
    else
      redis.call('ZREM', KEYS[1], ARGV[i])
      redis.call('ZREM', KEYS[2], ARGV[i])
    end
  end
end
return out
"""


class DeliverySchedule:
    def __init__(self, redis: RedisClient, *, lease_s: float, schedule: RetrySchedule) -> None:
        self._redis = redis
        self._lease_ms = int(lease_s * 1000)
        self._ttl_s = int(schedule.horizon_s() + lease_s + keys.WEBHOOK_PENDING_SLACK_S)
        self._add = redis.register_script(_ADD)
        self._claim = redis.register_script(_CLAIM)

    async def add_claimed(self, items: list[PendingDelivery], now: float,
                          incidents: list[PagerDutyIncident | None] | None = None) -> list[bool]:
        """Store new deliveries, already claimed by the caller (it attempts them right away).
        False for one already pending or finished (a redelivered record): not sent again; and
        for a recovery (``incidents[i].action == "close"``) with no incident open to resolve.
        One script call per shard, pipelined."""
        if not items:
            return []
        by_shard: dict[int, list[int]] = defaultdict(list)  # shard -> indexes into items
        for index, item in enumerate(items):
            by_shard[shard_of(item.delivery)].append(index)
        chosen = incidents or [None] * len(items)
        async with ScriptPipeline(self._redis) as pipe:
            for shard, indexes in by_shard.items():
                key_list = [keys.webhook_due(shard), keys.webhook_created(shard)]
                args: list[str | bytes | int] = []
                for index in indexes:
                    item, incident = items[index], chosen[index]
                    id_ = item.delivery.id
                    none = keys.webhook_incident(shard, "-", "-")
                    key_list += [keys.webhook_pending(shard, id_), keys.webhook_done(shard, id_),
                                 incident.key if incident else none, incident.legacy_key if incident else none]
                    args += [id_, item.to_json(), int(item.first_seen.timestamp() * 1000),
                             incident.action if incident else ""]
                args += [int(now * 1000), self._lease_ms, self._ttl_s, keys.WEBHOOK_INCIDENT_TTL_S]
                pipe.script(self._add, key_list, args)
            replies = await pipe.execute()
        added = [False] * len(items)
        for indexes, reply in zip(by_shard.values(), replies, strict=True):
            for index, flag in zip(indexes, reply, strict=True):
                added[index] = bool(flag)
        return added

    async def claim_due(self, now: float, limit: int,
                        shards: Sequence[int] = range(keys.WEBHOOK_SHARDS)) -> list[PendingDelivery]:
        """Up to ``limit`` due deliveries of ``shards`` (all by default), the longest due first,
        each claimed for one lease: one round trip lists them, one claims the chosen."""
        if limit <= 0:
            return []
        now_ms = int(now * 1000)
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.zrangebyscore(keys.webhook_due(shard), "-inf", now_ms, start=0, num=limit, withscores=True)
            listed = await pipe.execute()
        due = sorted((score, shard, _text(id_)) for shard, rows in zip(shards, listed, strict=True)
                     for id_, score in rows)[:limit]
        if not due:
            return []
        ids_by_shard: dict[int, list[str]] = defaultdict(list)
        for _, shard, id_ in due:
            ids_by_shard[shard].append(id_)
        async with ScriptPipeline(self._redis) as script_pipe:
            for shard, ids in ids_by_shard.items():
                script_pipe.script(self._claim, [keys.webhook_due(shard), keys.webhook_created(shard),
                                                 *(keys.webhook_pending(shard, i) for i in ids)],
                                   [now_ms, self._lease_ms, *ids])
            claimed = await script_pipe.execute()
        return [PendingDelivery.model_validate_json(doc) for docs in claimed for doc in docs]

    async def write(self, writes: ScheduleWrites) -> None:
        """What attempts ended in, in one round trip: finished deliveries leave the schedule
        (with their outcome kept), failed ones wait for their retry with the attempt recorded,
        postponed ones (breaker open, channel behind, shutting down) move without an attempt.
        Every write is idempotent, so a flush that failed half-way can be sent again."""
        if not writes:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for id_, (shard, outcome) in writes.finished.items():
                pipe.delete(keys.webhook_pending(shard, id_))
                pipe.zrem(keys.webhook_due(shard), id_)
                pipe.zrem(keys.webhook_created(shard), id_)
                pipe.set(keys.webhook_done(shard, id_), outcome, ex=keys.WEBHOOK_DONE_TTL_S)
            for pending, at in writes.retries.values():
                id_, shard = pending.delivery.id, shard_of(pending.delivery)
                pipe.set(keys.webhook_pending(shard, id_), pending.to_json(), ex=self._ttl_s, xx=True)
                pipe.zadd(keys.webhook_due(shard), {id_: int(at * 1000)}, xx=True)
            for id_, (shard, at) in writes.postponed.items():
                pipe.zadd(keys.webhook_due(shard), {id_: int(at * 1000)}, xx=True)
            await pipe.execute()

    async def retry(self, pending: PendingDelivery, at: float) -> None:
        """Keep the delivery (with its new attempt) for another try at ``at``."""
        writes = ScheduleWrites()
        writes.retry(pending, at)
        await self.write(writes)

    async def postpone(self, deliveries: list[WebhookDelivery], at: float) -> None:
        """Try these again at ``at`` without counting an attempt."""
        writes = ScheduleWrites()
        for delivery in deliveries:
            writes.postpone(delivery, at)
        await self.write(writes)

    async def finish(self, delivery: WebhookDelivery, outcome: Literal["delivered", "dead"]) -> None:
        writes = ScheduleWrites()
        writes.finish(delivery, outcome)
        await self.write(writes)

    async def forget_dead(self, deliveries: list[WebhookDelivery]) -> None:
        """Let dead-lettered deliveries be scheduled again (a replay); delivered ones stay done."""
        done_keys = [keys.webhook_done(shard_of(d), d.id) for d in deliveries]
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in done_keys:
                pipe.get(key)
            outcomes = await pipe.execute()
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, outcome in zip(done_keys, outcomes, strict=True):
                if outcome == b"dead":
                    pipe.delete(key)  # one key per command: on a cluster each has its own slot
            await pipe.execute()

    async def stats(self, now: float) -> tuple[int, float]:
        """(deliveries pending, age in seconds of the oldest)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(keys.WEBHOOK_SHARDS):
                pipe.zcard(keys.webhook_due(shard))
                pipe.zrange(keys.webhook_created(shard), 0, 0, withscores=True)
            replies = await pipe.execute()
        count = sum(int(c) for c in replies[0::2])
        oldest = min((rows[0][1] for rows in replies[1::2] if rows), default=None)
        age = max(0.0, now - oldest / 1000) if oldest is not None else 0.0
        return count, age


    async def move_unsharded(self, incident_shards: dict[str, int]) -> int:
        """Deliveries scheduled before the schedule was sharded - all under one hash tag - move
        to their shards, keeping their due time; open incidents move with them
        (``incident_shards``: channel hash -> shard, from the catalog; an incident of a channel
        no longer there is left to expire). Safe to run by several workers at once and again
        (every write is ``NX``, the old keys go last). Done marks are not moved: a record
        redelivered after the move may be sent once more, and receivers dedupe on
        ``webhook-id``. Returns how many deliveries moved."""
        old = f"{keys.PREFIX}:webhooks:{{webhooks}}"
        rows = cast(list[tuple[bytes, float]], await self._redis.zrange(f"{old}:due", 0, -1, withscores=True))
        ids = [_text(id_) for id_, _ in rows]
        moved = 0
        if ids:
            async with self._redis.pipeline(transaction=False) as pipe:
                for id_ in ids:
                    pipe.get(f"{old}:pending:{id_}")
                docs = await pipe.execute()
            async with self._redis.pipeline(transaction=False) as pipe:
                for id_, (_, due_ms), doc in zip(ids, rows, docs, strict=True):
                    if doc is None:
                        continue  # finished or expired since it was listed
                    try:
                        pending = PendingDelivery.model_validate_json(doc)
                    except ValidationError:
                        continue  # unreadable: it could never be sent; it leaves with the old keys
                    shard = shard_of(pending.delivery)
                    pipe.set(keys.webhook_pending(shard, id_), doc, ex=self._ttl_s, nx=True)
                    pipe.zadd(keys.webhook_due(shard), {id_: int(due_ms)}, nx=True)
                    pipe.zadd(keys.webhook_created(shard), {id_: int(pending.first_seen.timestamp() * 1000)}, nx=True)
                    pipe.expire(keys.webhook_due(shard), self._ttl_s)
                    pipe.expire(keys.webhook_created(shard), self._ttl_s)
                    moved += 1
                await pipe.execute()
            async with self._redis.pipeline(transaction=False) as pipe:
                for id_ in ids:
                    pipe.zrem(f"{old}:due", id_)
                    pipe.zrem(f"{old}:created", id_)
                    pipe.delete(f"{old}:pending:{id_}")
                await pipe.execute()
        async for key in self._redis.scan_iter(match=f"{old}:incident:*", count=500):
            channel_hash, _, signal_key = _text(key).removeprefix(f"{old}:incident:").partition(":")
            if channel_hash in incident_shards:
                ttl = await self._redis.ttl(key)
                new = keys.webhook_incident(incident_shards[channel_hash], channel_hash, signal_key)
                await self._redis.set(new, "1", ex=ttl if ttl > 0 else keys.WEBHOOK_INCIDENT_TTL_S, nx=True)
                await self._redis.delete(key)
        return moved


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
