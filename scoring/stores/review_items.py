"""Review queues' items in Redis (issue 55): taken when their result is published, one script call
per queue, pipelined - one round trip for a batch of results whatever the queues.

Taking an item (``_TAKE``), for each item of the call, in order:

1. an item already there (its result published again: a redelivery, a worker that died before
   its done mark) is left as it is - open, held or done - and counts nothing;
2. a queue with ``capacity`` open items turns the item away and counts it: what people have not
   reached yet is not pushed out by what came after it;
3. else the item is kept, and open (oldest first);
4. items taken more than the queue's ``keepDays`` ago go, open or done, and the keys' TTL is
   pushed to ``keepDays`` (a deleted queue's keys expire then).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import orjson

from scorer_groups.review_queues import ReviewItem, ReviewQueue, ScoreCard
from scoring.stores import keys
from scoring.stores.client import RedisClient
from scoring.stores.scripts import ScriptPipeline

DAY_S = 86_400

# KEYS: items, open, created, counts, held, labels, done, labels-out, scores. ARGV: capacity, now,
# keep seconds, then (id, document, score card) triples. Returns {taken, turned away}.
_TAKE = """
local capacity, now, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - keep, 'LIMIT', 0, 100)
for _, id in ipairs(old) do
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
  redis.call('HDEL', KEYS[5], id)
  redis.call('HDEL', KEYS[6], id)
  redis.call('ZREM', KEYS[7], id)
  redis.call('HDEL', KEYS[9], id)
end
local taken, away = 0, 0
for i = 4, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], id) == 0 then
    if redis.call('ZCARD', KEYS[2]) >= capacity then
      away = away + 1
    else
      redis.call('HSET', KEYS[1], id, ARGV[i + 1])
      redis.call('HSET', KEYS[9], id, ARGV[i + 2])
      redis.call('ZADD', KEYS[2], now, id)
      redis.call('ZADD', KEYS[3], now, id)
      taken = taken + 1
    end
  end
end
if taken > 0 then redis.call('HINCRBY', KEYS[4], 'taken', taken) end
if away > 0 then redis.call('HINCRBY', KEYS[4], 'turnedAway', away) end
for _, k in ipairs({1, 2, 3, 4, 5, 6, 7, 9}) do redis.call('EXPIRE', KEYS[k], keep) end  -- (8: by each label)
return {taken, away}
"""

# A reservation's holder, or nil once it ran out (shared by the scripts below).
_HOLDER = """
local function holder(id, now)
  local h = redis.call('HGET', KEYS[2], id)
  if not h then return nil end
  local sep = string.find(h, '\t', 1, true)
  local untl = tonumber(string.sub(h, sep + 1))
  if untl <= now then return nil end
  return string.sub(h, 1, sep - 1), untl
end
"""

# KEYS: open, held, labels. ARGV: reviewer key, now, reservation seconds, how many open items to
# look through. The item this reviewer holds (again), else the oldest open item nobody holds that
# they have not labelled, reserved now: {id, until}; or false.
_NEXT = _HOLDER + """
local reviewer, now = ARGV[1], tonumber(ARGV[2])
local mine = redis.call('HGET', KEYS[2], 'by:' .. reviewer)
if mine and redis.call('ZSCORE', KEYS[1], mine) then
  local who, untl = holder(mine, now)
  if who == reviewer then return {mine, tostring(untl)} end
end
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)) do
  if not holder(id, now) then
    local labels = redis.call('HGET', KEYS[3], id)
    if not labels or cjson.decode(labels)[reviewer] == nil then
      local untl = now + tonumber(ARGV[3])
      redis.call('HSET', KEYS[2], id, reviewer .. '\t' .. untl, 'by:' .. reviewer, id)
      return {id, tostring(untl)}
    end
  end
end
return false
"""

# KEYS: open, held, labels, done, items, labels-out. ARGV: item, reviewer key, label (JSON),
# reviewers per item, now, keep seconds. A reviewer labels an item they hold, or changes their
# label while it is open - the version also goes to the labels' outbox, in the same script:
# {"ok", labels now, version, 1 when the item is done by it}; else {"missing"}, {"done"},
# {"not_held"}.
_LABEL = _HOLDER + """
local item, reviewer, now = ARGV[1], ARGV[2], tonumber(ARGV[5])
if redis.call('HEXISTS', KEYS[5], item) == 0 then return {'missing'} end
if redis.call('ZSCORE', KEYS[4], item) then return {'done'} end
local raw = redis.call('HGET', KEYS[3], item)
local labels = raw and cjson.decode(raw) or {}
local who = holder(item, now)
if labels[reviewer] == nil and who ~= reviewer then return {'not_held'} end
local label = cjson.decode(ARGV[3])
label['version'] = labels[reviewer] and (labels[reviewer]['version'] + 1) or 1
labels[reviewer] = label
redis.call('HSET', KEYS[3], item, cjson.encode(labels))
redis.call('XADD', KEYS[6], '*', 'label', cjson.encode(label))
redis.call('EXPIRE', KEYS[6], tonumber(ARGV[6]))
if who == reviewer then redis.call('HDEL', KEYS[2], item, 'by:' .. reviewer) end
local count = 0
for _ in pairs(labels) do count = count + 1 end
local done = 0
if count >= tonumber(ARGV[4]) then
  redis.call('ZREM', KEYS[1], item)
  redis.call('ZADD', KEYS[4], now, item)
  redis.call('HDEL', KEYS[2], item)
  done = 1
end
return {'ok', count, label['version'], done}
"""


@dataclass(frozen=True)
class Taken:
    """What a batch did to one queue."""

    queue_id: str
    project_id: str
    taken: int
    turned_away: int


@dataclass(frozen=True)
class Labelled:
    """What a label did: the item's labels now, this reviewer's version, whether the item is done."""

    labels: int
    version: int
    done: bool


class LabelRefused(Exception):
    """Why a label was not kept: "missing" (no such item), "done" (the item has its labels),
    "not_held" (the reviewer does not hold it and has not labelled it)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _queue_keys(queue_id: str) -> list[str]:
    return [keys.review_items(queue_id), keys.review_open(queue_id), keys.review_created(queue_id),
            keys.review_counts(queue_id), keys.review_held(queue_id), keys.review_labels(queue_id),
            keys.review_done(queue_id), keys.review_labels_out(queue_id), keys.review_scores(queue_id)]


def _score_card(item: ReviewItem) -> bytes:
    """What the agreement figures read of an item (``ScoreCard``)."""
    return ScoreCard(group_id=item.group_id, rating_id=item.rating_id, rating=item.rating.rating,
                     judges={m.ref_id: float(m.native) for m in item.rating.members
                             if m.kind == "judge" and m.status == "scored" and m.native is not None
                             and not isinstance(m.native, bool)}).to_json()


class ReviewItems:
    # How many open items a ``next`` looks through for one this reviewer may take: the items
    # others hold or this reviewer labelled are skipped; past this, it answers none for now.
    NEXT_SCAN = 10_000

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._take = redis.register_script(_TAKE)
        self._next = redis.register_script(_NEXT)
        self._label = redis.register_script(_LABEL)

    async def take(self, items: Sequence[tuple[ReviewItem, ReviewQueue]], now: float) -> list[Taken]:
        """Keep ``items`` in their queues (each with its queue as the snapshot that decided it had
        it: capacity, keepDays); one round trip."""
        by_queue: dict[str, list[ReviewItem]] = defaultdict(list)
        queues: dict[str, ReviewQueue] = {}
        for item, queue in items:
            by_queue[queue.id].append(item)
            queues[queue.id] = queue
        if not by_queue:
            return []
        async with ScriptPipeline(self._redis) as pipe:
            for queue_id, of_queue in by_queue.items():
                queue = queues[queue_id]
                args: list[object] = [queue.capacity, now, queue.keep_days * DAY_S]
                for item in of_queue:
                    args += [item.id, item.to_json(), _score_card(item)]
                pipe.script(self._take, _queue_keys(queue_id), args)
            replies = await pipe.execute()
        return [Taken(queue_id, queues[queue_id].project_id, int(reply[0]), int(reply[1]))
                for queue_id, reply in zip(by_queue, replies, strict=True)]

    async def page(self, queue_id: str, *, state: str = "open", limit: int = 50,
                   cursor: int = 0) -> tuple[list[ReviewItem], int | None]:
        """Open items oldest first (``state`` "open"), or every item newest first ("all")."""
        ids: list[bytes]
        if state == "open":
            ids = cast(list[bytes], await self._redis.zrange(keys.review_open(queue_id), cursor, cursor + limit))
        else:
            ids = cast(list[bytes], await self._redis.zrevrange(keys.review_created(queue_id), cursor,
                                                                cursor + limit))
        more = len(ids) > limit
        ids = ids[:limit]
        documents = await self._redis.hmget(keys.review_items(queue_id), ids) if ids else []
        items = [ReviewItem.model_validate_json(d) for d in documents if d is not None]
        return items, (cursor + limit if more else None)

    async def counts(self, queue_id: str) -> dict[str, int]:
        """Open items now; taken and turned away since the queue began."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(keys.review_open(queue_id))
            pipe.hgetall(keys.review_counts(queue_id))
            open_now, counts = await pipe.execute()
        named = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in counts.items()}
        return {"open": int(open_now), "taken": named.get("taken", 0), "turnedAway": named.get("turnedAway", 0)}

    async def next(self, queue: ReviewQueue, reviewer_key: str, now: float) -> tuple[str, float] | None:
        """Reserve for ``reviewer_key`` the item they hold, else the oldest open item nobody else
        holds that they have not labelled: (its id, until when); None when there is none."""
        found = await self._next(keys=[keys.review_open(queue.id), keys.review_held(queue.id),
                                       keys.review_labels(queue.id)],
                                 args=[reviewer_key, now, queue.reservation_seconds, self.NEXT_SCAN])
        if not found:
            return None
        item_id, until = found
        return (item_id.decode() if isinstance(item_id, bytes) else item_id), float(until)

    async def label(self, queue: ReviewQueue, item_id: str, reviewer_key: str, label: bytes,
                    now: float) -> Labelled:
        """Keep ``label`` (JSON) as ``reviewer_key``'s label of the item; raises ``LabelRefused``."""
        reply = await self._label(keys=[keys.review_open(queue.id), keys.review_held(queue.id),
                                        keys.review_labels(queue.id), keys.review_done(queue.id),
                                        keys.review_items(queue.id), keys.review_labels_out(queue.id)],
                                  args=[item_id, reviewer_key, label, queue.reviewers_per_item, now,
                                        queue.keep_days * DAY_S])
        status = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
        if status != "ok":
            raise LabelRefused(status)
        await self._redis.zadd(keys.REVIEW_LABELS_PENDING, {queue.id: now})  # the exporter's cue
        return Labelled(int(reply[1]), int(reply[2]), bool(int(reply[3])))

    # --- the labels' outbox (consumers.label_export) ------------------------------------------

    async def pending_queues(self) -> list[str]:
        members = cast(list[bytes], await self._redis.zrange(keys.REVIEW_LABELS_PENDING, 0, -1))
        return [q.decode() for q in members]

    async def outbox(self, queue_id: str, count: int = 500) -> list[tuple[bytes, bytes]]:
        """The oldest label versions not yet exported: (stream id, label JSON)."""
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       await self._redis.xrange(keys.review_labels_out(queue_id), count=count))
        return [(entry_id, fields[b"label"]) for entry_id, fields in entries]

    async def exported(self, queue_id: str, entry_ids: Sequence[bytes]) -> None:
        """Label versions acknowledged by the broker leave the outbox."""
        if entry_ids:
            await self._redis.xdel(keys.review_labels_out(queue_id), *entry_ids)

    async def settle(self, queue_id: str) -> None:
        """A queue whose outbox was emptied leaves the pending set - and comes back at once if a
        label came meanwhile (its mark may have landed before this removal)."""
        await self._redis.zrem(keys.REVIEW_LABELS_PENDING, queue_id)
        if await self._redis.xlen(keys.review_labels_out(queue_id)):
            await self._redis.zadd(keys.REVIEW_LABELS_PENDING, {queue_id: 0})

    async def mark_unexported(self, queue_ids: Sequence[str], now: float) -> int:
        """The sweep: queues whose outbox holds labels go (back) into the pending set."""
        if not queue_ids:
            return 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue_id in queue_ids:
                pipe.xlen(keys.review_labels_out(queue_id))
            lengths = await pipe.execute()
        waiting = {q: now for q, n in zip(queue_ids, lengths, strict=True) if n}
        if waiting:
            await self._redis.zadd(keys.REVIEW_LABELS_PENDING, waiting)
        return len(waiting)

    async def view(self, queue_id: str, item_id: str) -> tuple[ReviewItem, bool, dict[str, dict[str, object]],
                                                                 tuple[str, float] | None] | None:
        """The item, whether it is done, its labels by reviewer key, and its reservation
        (holder, until) - or None when the queue keeps no such item."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.review_items(queue_id), item_id)
            pipe.zscore(keys.review_done(queue_id), item_id)
            pipe.hget(keys.review_labels(queue_id), item_id)
            pipe.hget(keys.review_held(queue_id), item_id)
            document, done_at, labels, held = await pipe.execute()
        if document is None:
            return None
        reservation = None
        if held is not None:
            holder, _, until = (held.decode() if isinstance(held, bytes) else held).partition("\t")
            reservation = (holder, float(until))
        return (ReviewItem.model_validate_json(document), done_at is not None,
                orjson.loads(labels) if labels else {}, reservation)

    async def labelled(self, queue_id: str) -> list[tuple[ScoreCard, dict[str, dict[str, object]]]]:
        """Every labelled item of the queue: what the machine said, and the labels by reviewer key."""
        labels = cast(dict[bytes, bytes], await self._redis.hgetall(keys.review_labels(queue_id)))
        if not labels:
            return []
        ids = list(labels)
        cards = cast(list[bytes | None], await self._redis.hmget(keys.review_scores(queue_id), ids))
        return [(ScoreCard.model_validate_json(card), orjson.loads(labels[item_id]))
                for item_id, card in zip(ids, cards, strict=True) if card is not None]

    async def labelled_items(self, queue_id: str, limit: int) -> list[tuple[ReviewItem, dict[str, dict[str, object]]]]:
        """Up to ``limit`` labelled items of the queue, oldest first, with their labels by reviewer key."""
        labels = cast(dict[bytes, bytes], await self._redis.hgetall(keys.review_labels(queue_id)))
        found: list[tuple[ReviewItem, dict[str, dict[str, object]]]] = []
        ids = list(labels)
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            documents = cast(list[bytes | None], await self._redis.hmget(keys.review_items(queue_id), chunk))
            found += [(ReviewItem.model_validate_json(d), orjson.loads(labels[i]))
                      for i, d in zip(chunk, documents, strict=True) if d is not None]
        found.sort(key=lambda pair: (pair[0].created_at, pair[0].id))
        return found[:limit]
