"""Incidents in Redis: what a watcher reads - a window of a group's results, from the
ratings history's buckets - and what the fleet shares: each watch's state, the group's learned
level, and its incidents (for the API).

Once per fleet: a watch moves by one script that checks the version the mover read, so of
the workers that decide the same opening or resolution from the same buckets, one moves it and
publishes; the others find it moved. The move also records the event as ``pending`` until its
Signal and deliveries are acknowledged: a worker that died in between leaves it to the next
watcher, which publishes it again under the same ids (every consumer deduplicates on them).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from adapters.stores import keys
from adapters.stores.client import RedisClient
from scorer_groups.documents import IncidentReason
from scoring.incidents import Baseline, Watch, WindowStats

PENDING_S = 30.0  # an event moved but not published this long ago is published again

# KEYS: the watch, the group's incidents, their order. ARGV: the version read, the new version,
# the open incident ("" none), its opening time, the pending event (JSON), the incident's id and
# record (JSON), the records' TTL, the channels it pages (JSON; the opening's, kept for its
# resolution), the incident's opening time (for its order), the incidents a group keeps, when the
# watch moves ("" unknown).
# 1 if moved; 0 if another mover was first, or an event is still pending (never overwritten: a
# resolution whose mover died is published before the watch moves again). A watch has no TTL:
# its version names its incidents (scoring.incidents.incident_id), and a watch that expired would
# start again at 0 and name a new incident as an old one - whose Signals are deduplicated away.
# Past the incidents a group keeps, the oldest resolved ones go (an open one stays whatever its
# age); records from before the order existed join it first, as the oldest.
_MOVE = """
if (redis.call('HGET', KEYS[1], 'version') or '0') ~= ARGV[1] then return 0 end
if redis.call('HEXISTS', KEYS[1], 'pending') == 1 then return 0 end
redis.call('HSET', KEYS[1], 'version', ARGV[2], 'incident', ARGV[3], 'openedAt', ARGV[4], 'pending', ARGV[5],
           'channels', ARGV[9], 'since', ARGV[12])
redis.call('HSET', KEYS[2], ARGV[6], ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[8])
if redis.call('HLEN', KEYS[2]) > redis.call('ZCARD', KEYS[3]) then
  for _, id in ipairs(redis.call('HKEYS', KEYS[2])) do redis.call('ZADD', KEYS[3], 'NX', 0, id) end
end
redis.call('ZADD', KEYS[3], ARGV[10], ARGV[6])
redis.call('EXPIRE', KEYS[3], ARGV[8])
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[11])
if over > 0 then
  for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, over + 3)) do
    if over == 0 then break end
    local record = redis.call('HGET', KEYS[2], id)
    if not record or not string.find(record, '"state":"open"', 1, true) then
      redis.call('HDEL', KEYS[2], id)
      redis.call('ZREM', KEYS[3], id)
      over = over - 1
    end
  end
end
return 1
"""

_PUBLISHED = """
if (redis.call('HGET', KEYS[1], 'version') or '0') ~= ARGV[1] then return 0 end
redis.call('HDEL', KEYS[1], 'pending')
return 1
"""

FIELDS = ("count", "scored", "sum", "noscore", "skipped", "below")


def bucket_size(reach_s: float) -> int:
    """The history's finest buckets still held ``reach_s`` back from now: each granularity is
    kept for its chart's span (``keys.RATING_WINDOWS``: a minute for an hour, a quarter of an
    hour for a day, ...); past every span, the coarsest (which holds nothing there either)."""
    size = 0
    for held_s, size in keys.RATING_WINDOWS.values():
        if reach_s <= held_s:
            return size
    return size


def _opened_at(record: Mapping[str, Any], default: float) -> float:
    """An incident's opening time, its place in the group's order (a record says it in ISO)."""
    try:
        return datetime.fromisoformat(str(record["openedAt"])).timestamp()
    except (KeyError, ValueError):
        return default


class IncidentStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._move = redis.register_script(_MOVE)
        self._published = redis.register_script(_PUBLISHED)

    async def window(self, group_id: str, start: float, end: float, now: float) -> WindowStats:
        """The counts of the group's live results in ``[start, end]``, by whole buckets of the
        finest size still held back to ``start`` (``bucket_size``): from the one ``start`` falls in
        (a window reaches back by up to a bucket more). A backfill's results, counted at their
        traces' own times, are left out: last week's traffic - or an hour's, graded again under a
        new rubric - opens and resolves nothing."""
        size = bucket_size(now - start)
        starts = range(int(start) // size * size, int(end) + 1, size)
        async with self._redis.pipeline(transaction=False) as pipe:
            for bucket in starts:  # live traffic only: a bucket less its part counted at past times
                pipe.hmget(keys.rating_bucket(group_id, size, bucket), FIELDS)
                pipe.hmget(keys.rating_bucket_past(group_id, size, bucket), FIELDS)
            rows = await pipe.execute() if starts else []
        totals = [0.0] * len(FIELDS)
        for n, row in enumerate(rows):
            sign = -1.0 if n % 2 else 1.0
            for i, value in enumerate(row):
                totals[i] += sign * float(value) if value is not None else 0.0
        count, scored, total, no_score, skipped, below = totals
        return WindowStats(int(count), int(scored), total, int(no_score), int(skipped), int(below))

    async def watch(self, group_id: str, reason: IncidentReason) -> tuple[Watch, dict[str, Any] | None]:
        """The watch, and its event not yet published (if any)."""
        watch, pending, _ = await self.watch_with_channels(group_id, reason)
        return watch, pending

    async def watch_with_channels(self, group_id: str, reason: IncidentReason
                                  ) -> tuple[Watch, dict[str, Any] | None, list[list[str]]]:
        """The watch, its event not yet published, and the channels its incident pages
        ([agentId, channel key] each)."""
        raw = await self._redis.hgetall(keys.incident_watch(group_id, reason))
        fields = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                  for k, v in raw.items()}
        watch = Watch(fields.get("incident") or None, float(fields["openedAt"]) if fields.get("openedAt") else None,
                      int(fields.get("version", 0)), float(fields["since"]) if fields.get("since") else None)
        pending = orjson.loads(fields["pending"]) if fields.get("pending") else None
        return watch, pending, orjson.loads(fields["channels"]) if fields.get("channels") else []

    async def move(self, group_id: str, reason: IncidentReason, read: Watch, moved: Watch,
                   event: Mapping[str, Any], record: Mapping[str, Any], channels: Sequence[Sequence[str]] = (),
                   now: float | None = None) -> bool:
        """Move the watch from the version read to ``moved``, the event pending; False if
        another worker moved it first (or an event of it is still pending). An open incident is
        listed among the open watches (``open_watches``) until its resolution is published."""
        now = time.time() if now is None else now
        answer = await self._move(keys=[keys.incident_watch(group_id, reason), keys.group_incidents(group_id),
                                        keys.group_incidents_order(group_id)],
                                  args=[read.version, moved.version, moved.incident_id or "",
                                        "" if moved.opened_at is None else repr(moved.opened_at),
                                        orjson.dumps({**event, "movedAt": now}),
                                        str(record["id"]), orjson.dumps(record), keys.INCIDENTS_KEPT_S,
                                        orjson.dumps([list(c) for c in channels]), repr(_opened_at(record, now)),
                                        keys.INCIDENTS_KEPT, "" if moved.since is None else repr(moved.since)])
        if answer and moved.incident_id is not None:
            await self._redis.sadd(keys.INCIDENTS_OPEN, f"{group_id}|{reason}")
        # A resolution leaves the open watches once its event is published (``published``): till
        # then the watch is looked at whatever its traffic, so a mover that died in between is
        # made up for even when the group went quiet.
        return bool(answer)

    async def open_watches(self) -> list[tuple[str, str]]:
        """(group, reason) of every incident open, whatever watches them now."""
        members = await self._redis.smembers(keys.INCIDENTS_OPEN)
        found = [(m.decode() if isinstance(m, bytes) else str(m)).split("|", 1) for m in members]
        return sorted((group, reason) for group, reason in found)

    async def forget_open(self, group_id: str, reason: str) -> None:
        await self._redis.srem(keys.INCIDENTS_OPEN, f"{group_id}|{reason}")

    async def record(self, group_id: str, incident_id: str) -> dict[str, Any] | None:
        raw = await self._redis.hget(keys.group_incidents(group_id), incident_id)
        return orjson.loads(raw) if raw else None

    async def published(self, group_id: str, reason: IncidentReason, version: int) -> None:
        await self._published(keys=[keys.incident_watch(group_id, reason)], args=[version])
        if not await self._redis.hget(keys.incident_watch(group_id, reason), "incident"):  # resolved, now said
            await self._redis.srem(keys.INCIDENTS_OPEN, f"{group_id}|{reason}")

    async def level(self, group_id: str) -> Baseline:
        raw = await self._redis.get(keys.incident_level(group_id))
        if not raw:
            return Baseline()
        d = orjson.loads(raw)
        return Baseline(d["mean"], d["variance"], d["learned"], d["lastWindow"])

    async def learn(self, group_id: str, level: Baseline) -> None:
        """The group's level, after a window learned (workers that learn the same window write
        the same level)."""
        await self._redis.set(keys.incident_level(group_id), orjson.dumps(
            {"mean": level.mean, "variance": level.variance, "learned": level.learned,
             "lastWindow": level.last_window}), ex=keys.INCIDENTS_KEPT_S)

    async def incidents(self, group_id: str) -> list[dict[str, object]]:
        """The group's incidents, newest first."""
        raw = await self._redis.hvals(keys.group_incidents(group_id))
        found = [orjson.loads(v) for v in raw]
        return sorted(found, key=lambda r: r.get("openedAt") or 0, reverse=True)
