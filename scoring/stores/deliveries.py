"""The durable retry schedule of webhook deliveries, kept in Redis.

A delivery read from the webhooks topic is written here before its offset is committed, so a
restart or a rebalance never loses it: whichever worker is alive claims it when it is due.

- ``due`` (sorted set, score = due time in ms): every delivery not yet finished. Claiming one
  moves its due time one lease ahead, so a worker that dies mid-attempt leaves it to be claimed
  again when the lease runs out (receivers deduplicate on ``webhook-id``).
- ``pending:<id>``: the delivery with its attempt history, with a TTL beyond the schedule.
- ``done:<id>``: "delivered" or "dead", kept a week, so a redelivered record is not sent again.
- ``created`` (sorted set): first-seen time of every pending delivery, for the oldest-age metric.

All keys share one hash tag, so the scripts run on Redis Cluster too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from redis.asyncio import Redis

from scoring.results import WebhookDelivery
from scoring.stores import keys
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
class Incident:
    """What a delivery does to a PagerDuty channel's incident: a trigger opens, a recovery closes."""

    action: Literal["open", "close"]
    key: str  # keys.webhook_incident(...)


@dataclass
class Settlements:
    """Schedule writes gathered from many attempts, sent together by ``DeliverySchedule.settle``."""

    finished: dict[str, Literal["delivered", "dead"]] = field(default_factory=dict)
    retries: dict[str, tuple[PendingDelivery, float]] = field(default_factory=dict)
    postponed: dict[str, float] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.finished or self.retries or self.postponed)


# --- The store --------------------------------------------------------------------------------

# KEYS: due, created, then per delivery: pending, done, incident. ARGV: per delivery: id, document,
# first seen (ms), incident action ('', 'open' or 'close'); then now (ms), lease (ms), TTL of a
# pending delivery, TTL of an incident. A 'close' (a recovery) is scheduled only when an incident
# is open for it, and closes it; an 'open' (a trigger) opens one.
_ADD = """
local tail = #ARGV - 4
local now, lease, ttl, incident_ttl = ARGV[tail + 1], ARGV[tail + 2], ARGV[tail + 3], ARGV[tail + 4]
local added = {}
for i = 1, tail, 4 do
  local n = (i + 3) / 4
  local pending, done, incident = KEYS[3 * n], KEYS[3 * n + 1], KEYS[3 * n + 2]
  local action = ARGV[i + 3]
  if redis.call('EXISTS', done) == 1 or redis.call('EXISTS', pending) == 1 then
    added[n] = 0
  elseif action == 'close' and redis.call('DEL', incident) == 0 then
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
    def __init__(self, redis: Redis, *, lease_s: float, schedule: RetrySchedule) -> None:
        self._redis = redis
        self._lease_ms = int(lease_s * 1000)
        self._ttl_s = int(schedule.horizon_s() + lease_s + keys.WEBHOOK_PENDING_SLACK_S)
        self._add = redis.register_script(_ADD)
        self._claim = redis.register_script(_CLAIM)

    async def add_claimed(self, items: list[PendingDelivery], now: float,
                          incidents: list[Incident | None] | None = None) -> list[bool]:
        """Store new deliveries, already claimed by the caller (it attempts them right away).
        False for one already pending or finished (a redelivered record): not sent again; and
        for a recovery (``incidents[i].action == "close"``) with no incident open to resolve."""
        if not items:
            return []
        key_list = [keys.WEBHOOK_DUE, keys.WEBHOOK_CREATED]
        args: list[str | bytes | int] = []
        for item, incident in zip(items, incidents or [None] * len(items), strict=True):
            key_list += [keys.webhook_pending(item.delivery.id), keys.webhook_done(item.delivery.id),
                         incident.key if incident else keys.webhook_incident("-", "-")]
            args += [item.delivery.id, item.to_json(), int(item.first_seen.timestamp() * 1000),
                     incident.action if incident else ""]
        args += [int(now * 1000), self._lease_ms, self._ttl_s, keys.WEBHOOK_INCIDENT_TTL_S]
        added = await self._add(keys=key_list, args=args)
        return [bool(a) for a in added]

    async def claim_due(self, now: float, limit: int) -> list[PendingDelivery]:
        """Up to ``limit`` due deliveries, each claimed for one lease."""
        if limit <= 0:
            return []
        now_ms = int(now * 1000)
        listed = await self._redis.zrangebyscore(keys.WEBHOOK_DUE, "-inf", now_ms, start=0, num=limit)
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in listed]
        if not ids:
            return []
        docs = await self._claim(keys=[keys.WEBHOOK_DUE, keys.WEBHOOK_CREATED,
                                       *(keys.webhook_pending(i) for i in ids)],
                                 args=[now_ms, self._lease_ms, *ids])
        return [PendingDelivery.model_validate_json(doc) for doc in docs]

    async def settle(self, writes: Settlements) -> None:
        """What attempts ended in, in one round trip: finished deliveries leave the schedule
        (with their outcome kept), failed ones wait for their retry with the attempt recorded,
        postponed ones (breaker open, channel behind, shutting down) move without an attempt.
        Every write is idempotent, so a flush that failed half-way can be sent again."""
        if not writes:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for id_, outcome in writes.finished.items():
                pipe.delete(keys.webhook_pending(id_))
                pipe.zrem(keys.WEBHOOK_DUE, id_)
                pipe.zrem(keys.WEBHOOK_CREATED, id_)
                pipe.set(keys.webhook_done(id_), outcome, ex=keys.WEBHOOK_DONE_TTL_S)
            for pending, at in writes.retries.values():
                id_ = pending.delivery.id
                pipe.set(keys.webhook_pending(id_), pending.to_json(), ex=self._ttl_s, xx=True)
                pipe.zadd(keys.WEBHOOK_DUE, {id_: int(at * 1000)}, xx=True)
            if writes.postponed:
                pipe.zadd(keys.WEBHOOK_DUE, {id_: int(at * 1000) for id_, at in writes.postponed.items()}, xx=True)
            await pipe.execute()

    async def retry(self, pending: PendingDelivery, at: float) -> None:
        """Keep the delivery (with its new attempt) for another try at ``at``."""
        await self.settle(Settlements(retries={pending.delivery.id: (pending, at)}))

    async def postpone(self, delivery_ids: list[str], at: float) -> None:
        """Try these again at ``at`` without counting an attempt."""
        await self.settle(Settlements(postponed=dict.fromkeys(delivery_ids, at)))

    async def finish(self, delivery_id: str, outcome: Literal["delivered", "dead"]) -> None:
        await self.settle(Settlements(finished={delivery_id: outcome}))

    async def forget_dead(self, delivery_ids: list[str]) -> None:
        """Let dead-lettered deliveries be scheduled again (a replay); delivered ones stay done."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for id_ in delivery_ids:
                pipe.get(keys.webhook_done(id_))
            outcomes = await pipe.execute()
        dead = [keys.webhook_done(i) for i, o in zip(delivery_ids, outcomes, strict=True) if o == b"dead"]
        if dead:
            await self._redis.delete(*dead)

    async def stats(self, now: float) -> tuple[int, float]:
        """(deliveries pending, age in seconds of the oldest)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.WEBHOOK_DUE)
            pipe.zrange(keys.WEBHOOK_CREATED, 0, 0, withscores=True)
            count, oldest = await pipe.execute()
        age = max(0.0, now - oldest[0][1] / 1000) if oldest else 0.0
        return int(count), age
