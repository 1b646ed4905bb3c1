"""Review queues in Redis - items, labels, the labels' outbox: one module by design, its scripts share a queue's keys.

Items are taken when their result is published (``_TAKE``: one script call per queue, pipelined). The one
rule: an item already there is left as it is, and a full queue turns new items away (counted) rather than
push out what people have not reached; what a queue keeps is bounded. The steps of a take:
docs/design-notes.md.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, cast

import orjson

from adapters.stores import keys
from adapters.stores.client import RedisClient, one_connection
from adapters.stores.scripts import ScriptPipeline
from scorer_groups.review_queues import KEPT_PER_OPEN, ReviewItem, ReviewQueue, ScoreCard
from scoring.review_rules import KeptItem

DAY_S = 86_400

# Every script takes the queue's keys in this order (one hash tag: ``keys.review_tag``) and ends
# by pushing every one's TTL to keepDays (its last ARGV): a key first written by any script
# expires with the others.
_KEYS = """
local ITEMS, OPEN, CREATED, COUNTS, HELD, LABELS, DONE, OUTBOX, SCORES, LABELLED = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10
local function keep_all(keep)
  for k = 1, 10 do redis.call('EXPIRE', KEYS[k], keep) end
end
-- The time a reservation is judged by: the caller's ("" for the server's own clock, one clock
-- for every API process whatever theirs say).
local function clock(given)
  if given ~= '' then return tonumber(given) end
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

# ARGV: capacity, now, keep seconds, max bytes, then (id, document, score card) triples.
# {taken, turned away}. COUNTS' "bytes": what the items and cards kept take, added and taken
# away here - the only script that keeps or drops an item.
_TAKE = _KEYS + """
local capacity, now, keep, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local KEPT = """ + str(KEPT_PER_OPEN) + """  -- items kept (open or done) per open item of capacity
local freed = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[CREATED], '-inf', now - keep, 'LIMIT', 0, 100)) do
  freed = freed + redis.call('HSTRLEN', KEYS[ITEMS], id) + redis.call('HSTRLEN', KEYS[SCORES], id)
  local labels = redis.call('HGET', KEYS[LABELS], id)
  if labels then
    for reviewer in pairs(cjson.decode(labels)) do redis.call('SREM', KEYS[LABELLED], reviewer .. '\t' .. id) end
  end
  redis.call('HDEL', KEYS[ITEMS], id)
  redis.call('HDEL', KEYS[SCORES], id)
  redis.call('HDEL', KEYS[HELD], id)
  redis.call('HDEL', KEYS[LABELS], id)
  redis.call('ZREM', KEYS[OPEN], id)
  redis.call('ZREM', KEYS[CREATED], id)
  redis.call('ZREM', KEYS[DONE], id)
end
local stored = math.max(0, tonumber(redis.call('HGET', KEYS[COUNTS], 'bytes') or '0') - freed)
local taken, away = 0, 0
for i = 5, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HEXISTS', KEYS[ITEMS], id) == 0 then
    local size = #ARGV[i + 1] + #ARGV[i + 2]
    if redis.call('ZCARD', KEYS[OPEN]) >= capacity or redis.call('ZCARD', KEYS[CREATED]) >= KEPT * capacity
        or stored + size > most then
      away = away + 1
    else
      stored = stored + size
      redis.call('HSET', KEYS[ITEMS], id, ARGV[i + 1])
      redis.call('HSET', KEYS[SCORES], id, ARGV[i + 2])
      -- a microsecond apart: the items of one call are handed out in the order they came
      redis.call('ZADD', KEYS[OPEN], now + taken / 1000000, id)
      redis.call('ZADD', KEYS[CREATED], now + taken / 1000000, id)
      taken = taken + 1
    end
  end
end
if taken > 0 then redis.call('HINCRBY', KEYS[COUNTS], 'taken', taken) end
if away > 0 then redis.call('HINCRBY', KEYS[COUNTS], 'turnedAway', away) end
if taken > 0 or freed > 0 then redis.call('HSET', KEYS[COUNTS], 'bytes', stored) end
keep_all(keep)
return {taken, away}
"""

# A reservation's holder, or nil once it ran out (shared by the scripts below).
_HOLDER = """
local function holder(id, now)
  local h = redis.call('HGET', KEYS[HELD], id)
  if not h then return nil end
  local sep = string.find(h, '\t', 1, true)
  local untl = tonumber(string.sub(h, sep + 1))
  if untl <= now then return nil end
  return string.sub(h, 1, sep - 1), untl
end
"""

# ARGV: reviewer key, now ("": the server's), reservation seconds, how many open items to look
# through, keep seconds, reviewers per item. The item this reviewer holds (again), else the oldest
# open item nobody holds that they have not labelled, reserved now: {id, until}; or false. An open
# item that has its reviewers per item already (the queue asked for fewer since) is done on the way.
_NEXT = _KEYS + _HOLDER + """
local reviewer, now = ARGV[1], clock(ARGV[2])
local mine = redis.call('HGET', KEYS[HELD], 'by:' .. reviewer)
if mine and redis.call('ZSCORE', KEYS[OPEN], mine) then
  local who, untl = holder(mine, now)
  if who == reviewer then return {mine, tostring(untl)} end
end
local wanted = tonumber(ARGV[6])
for _, id in ipairs(redis.call('ZRANGE', KEYS[OPEN], 0, tonumber(ARGV[4]) - 1)) do
  if not holder(id, now) then
    local raw, count = redis.call('HGET', KEYS[LABELS], id), 0
    if raw then for _ in pairs(cjson.decode(raw)) do count = count + 1 end end
    if count >= wanted then  -- whoever labelled it: it has its labels
      redis.call('ZREM', KEYS[OPEN], id)
      redis.call('ZADD', KEYS[DONE], now, id)
      redis.call('HDEL', KEYS[HELD], id)
    elseif redis.call('SISMEMBER', KEYS[LABELLED], reviewer .. '\t' .. id) == 0 then
      local untl = now + tonumber(ARGV[3])
      redis.call('HSET', KEYS[HELD], id, reviewer .. '\t' .. untl, 'by:' .. reviewer, id)
      keep_all(tonumber(ARGV[5]))
      return {id, tostring(untl)}
    end
  end
end
return false
"""

# ARGV: item, reviewer key, label (JSON), reviewers per item, now ("": the server's), keep seconds. A reviewer labels
# an item they hold, or changes their label while it is open - the version also goes to the
# labels' outbox, in the same script: {"ok", labels now, version, 1 when the item is done by it};
# else {"missing"}, {"done"}, {"not_held"}. The same label sent again (a retry after a 503: the
# write may have reached the primary) is answered as kept, changing nothing.
_LABEL = _KEYS + _HOLDER + """
local function same(a, b)  -- the same label (what the reviewer said, whenever): a retry
  if a['rating'] ~= b['rating'] or a['comment'] ~= b['comment'] then return false end
  local am, bm = a['members'] or {}, b['members'] or {}
  for k, v in pairs(am) do
    local w = bm[k]
    if not w or w['agree'] ~= v['agree'] or w['rating'] ~= v['rating'] then return false end
  end
  for k in pairs(bm) do if not am[k] then return false end end
  return true
end
local item, reviewer, now = ARGV[1], ARGV[2], clock(ARGV[5])
if redis.call('HEXISTS', KEYS[ITEMS], item) == 0 then return {'missing'} end
local raw = redis.call('HGET', KEYS[LABELS], item)
local labels = raw and cjson.decode(raw) or {}
local label = cjson.decode(ARGV[3])
local done_at = redis.call('ZSCORE', KEYS[DONE], item)
if labels[reviewer] ~= nil and same(labels[reviewer], label) then  -- sent again (a 503's retry): kept
  local count = 0
  for _ in pairs(labels) do count = count + 1 end
  return {'ok', count, labels[reviewer]['version'], done_at and 1 or 0}
end
if done_at then return {'done'} end
local who = holder(item, now)
if labels[reviewer] == nil and who ~= reviewer then return {'not_held'} end
if labels[reviewer] == nil then redis.call('HINCRBY', KEYS[COUNTS], 'by:' .. reviewer, 1) end
label['version'] = labels[reviewer] and (labels[reviewer]['version'] + 1) or 1
labels[reviewer] = label
redis.call('HSET', KEYS[LABELS], item, cjson.encode(labels))
redis.call('SADD', KEYS[LABELLED], reviewer .. '\t' .. item)
redis.call('XADD', KEYS[OUTBOX], '*', 'label', cjson.encode(label))
if who == reviewer then redis.call('HDEL', KEYS[HELD], item, 'by:' .. reviewer) end
local count = 0
for _ in pairs(labels) do count = count + 1 end
local done = 0
if count >= tonumber(ARGV[4]) then
  redis.call('ZREM', KEYS[OPEN], item)
  redis.call('ZADD', KEYS[DONE], now, item)
  redis.call('HDEL', KEYS[HELD], item)
  done = 1
end
keep_all(tonumber(ARGV[6]))
return {'ok', count, label['version'], done}
"""


@dataclass(frozen=True)
class QueueIntake:
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


class QueueRef(NamedTuple):
    """What names a queue's keys: its project and id (a ``ReviewQueue`` is one too)."""

    project_id: str
    id: str


def _queue_keys(queue: ReviewQueue | QueueRef) -> list[str]:
    """The queue's keys, in the order the scripts name them (``_KEYS``)."""
    tag = keys.review_tag(queue.project_id, queue.id)
    return [keys.review_items(tag), keys.review_open(tag), keys.review_created(tag), keys.review_counts(tag),
            keys.review_held(tag), keys.review_labels(tag), keys.review_done(tag), keys.review_labels_out(tag),
            keys.review_scores(tag), keys.review_labelled(tag)]


def _keep(queue: ReviewQueue) -> int:
    return queue.keep_days * DAY_S


def pending_member(queue: ReviewQueue | QueueRef) -> str:
    """A queue in the exporter's pending set: "<project>/<queue>" (ids hold no "/")."""
    return f"{queue.project_id}/{queue.id}"


def _score_card(item: ReviewItem) -> bytes:
    """What the agreement figures read of an item (``ScoreCard``)."""
    return ScoreCard(group_id=item.group_id, rating_id=item.rating_id, rating=item.rating.rating,
                     judges={m.ref_id: float(m.native) for m in item.rating.members
                             if m.kind == "judge" and m.status == "scored" and m.native is not None
                             and not isinstance(m.native, bool)}).to_json()


class ReviewItems:
    # How many open items a ``next`` looks through for one this reviewer may take: the items
    # others hold or this reviewer labelled are skipped (one set lookup each); past this, it
    # answers none for now.
    NEXT_SCAN = 2_000
    CHUNK = 500  # items read at a time (exports, agreement)
    REPLICA_WAIT_MS = 2_000  # how long a label waits for a replica to hold it before it is refused (503)

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._take = redis.register_script(_TAKE)
        self._next = redis.register_script(_NEXT)
        self._label = redis.register_script(_LABEL)

    async def take(self, items: Sequence[tuple[ReviewItem | KeptItem, ReviewQueue]], now: float) -> list[QueueIntake]:
        """Keep ``items`` in their queues (each with its queue as the snapshot that decided it had
        it: capacity, keepDays); one round trip. An item comes as the model, or encoded already
        (the hot path's ``KeptItem``)."""
        by_queue: dict[tuple[str, str], list[ReviewItem | KeptItem]] = defaultdict(list)
        queues: dict[tuple[str, str], ReviewQueue] = {}
        for item, queue in items:
            by_queue[(queue.project_id, queue.id)].append(item)
            queues[(queue.project_id, queue.id)] = queue
        if not by_queue:
            return []
        async with ScriptPipeline(self._redis) as pipe:
            for key, of_queue in by_queue.items():
                queue = queues[key]
                args: list[object] = [queue.capacity, now, _keep(queue), queue.max_bytes]
                for item in of_queue:
                    if isinstance(item, KeptItem):
                        args += [item.id, item.document, item.card]
                    else:
                        args += [item.id, item.to_json(), _score_card(item)]
                pipe.script(self._take, _queue_keys(queue), args)
            replies = await pipe.execute()
        return [QueueIntake(queues[key].id, queues[key].project_id, int(reply[0]), int(reply[1]))
                for key, reply in zip(by_queue, replies, strict=True)]

    async def page(self, queue: ReviewQueue, *, state: str = "open", limit: int = 50,
                   cursor: int = 0) -> tuple[list[ReviewItem], int | None]:
        """Open items oldest first (``state`` "open"), or every item newest first ("all")."""
        k = _queue_keys(queue)
        ids: list[bytes]
        if state == "open":
            ids = cast(list[bytes], await self._redis.zrange(k[1], cursor, cursor + limit))
        else:
            ids = cast(list[bytes], await self._redis.zrevrange(k[2], cursor, cursor + limit))
        more = len(ids) > limit
        ids = ids[:limit]
        documents = await self._redis.hmget(k[0], ids) if ids else []
        items = [ReviewItem.model_validate_json(d) for d in documents if d is not None]
        return items, (cursor + limit if more else None)

    async def counts(self, queue: ReviewQueue) -> dict[str, int]:
        """Open items now; taken and turned away since the queue began."""
        k = _queue_keys(queue)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(k[1])
            pipe.hgetall(k[3])
            open_now, counts = await pipe.execute()
        named = {(key.decode() if isinstance(key, bytes) else key): int(v) for key, v in counts.items()}
        return {"open": int(open_now), "taken": named.get("taken", 0), "turnedAway": named.get("turnedAway", 0)}

    async def progress(self, queue: ReviewQueue, reviewer_key: str) -> dict[str, int]:
        """A reviewer's view of the queue: open items now, items done, items this key labelled."""
        k = _queue_keys(queue)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zcard(k[1])
            pipe.zcard(k[6])
            pipe.hget(k[3], f"by:{reviewer_key}")
            open_now, done, mine = await pipe.execute()
        return {"open": int(open_now), "done": int(done), "mine": int(mine or 0)}

    async def forget(self, queue: ReviewQueue) -> None:
        """A deleted queue's items, labels and outbox go with it (its labels are on the topic)."""
        await self._redis.delete(*_queue_keys(queue))
        await self._redis.zrem(keys.REVIEW_LABELS_PENDING, pending_member(queue))

    async def next(self, queue: ReviewQueue, reviewer_key: str, now: float | None = None) -> tuple[str, float] | None:
        """Reserve for ``reviewer_key`` the item they hold, else the oldest open item nobody else
        holds that they have not labelled: (its id, until when); None when there is none. ``now``:
        the server's clock by default (one clock for every API process)."""
        found = await self._next(keys=_queue_keys(queue), args=[reviewer_key, "" if now is None else now,
                                                                 queue.reservation_seconds, self.NEXT_SCAN,
                                                                 _keep(queue), queue.reviewers_per_item])
        if not found:
            return None
        item_id, until = found
        return (item_id.decode() if isinstance(item_id, bytes) else item_id), float(until)

    async def label(self, queue: ReviewQueue, item_id: str, reviewer_key: str, label: bytes,
                    now: float | None = None) -> Labelled:
        """Keep ``label`` (JSON) as ``reviewer_key``'s label of the item; raises ``LabelRefused``.
        ``now``: the server's clock by default, as ``next``'s."""
        names = _queue_keys(queue)
        async with one_connection(self._redis, names[0]) as connection:  # the label, then a replica has it
            reply = await connection.script(self._label, names, [item_id, reviewer_key, label,
                                                                 queue.reviewers_per_item, "" if now is None else now,
                                                                 _keep(queue)])
            if reply[0] in (b"ok", "ok"):
                await connection.on_a_replica(self.REPLICA_WAIT_MS)
        status = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
        if status != "ok":
            raise LabelRefused(status)
        await self._redis.zadd(keys.REVIEW_LABELS_PENDING,  # the exporter's cue
                               {pending_member(queue): time.time() if now is None else now})
        return Labelled(int(reply[1]), int(reply[2]), bool(int(reply[3])))

    async def view(self, queue: ReviewQueue, item_id: str) -> tuple[ReviewItem, bool, dict[str, dict[str, object]],
                                                                      tuple[str, float] | None] | None:
        """The item, whether it is done, its labels by reviewer key, and its reservation
        (holder, until) - or None when the queue keeps no such item."""
        k = _queue_keys(queue)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(k[0], item_id)
            pipe.zscore(k[6], item_id)
            pipe.hget(k[5], item_id)
            pipe.hget(k[4], item_id)
            document, done_at, labels, held = await pipe.execute()
        if document is None:
            return None
        reservation = None
        if held is not None:
            holder, _, until = (held.decode() if isinstance(held, bytes) else held).partition("\t")
            reservation = (holder, float(until))
        return (ReviewItem.model_validate_json(document), done_at is not None,
                orjson.loads(labels) if labels else {}, reservation)

    async def labelled(self, queue: ReviewQueue) -> list[tuple[ScoreCard, dict[str, dict[str, object]]]]:
        """Every labelled item of the queue: what the machine said, and the labels by reviewer key
        (bounded by the items the queue keeps: keepDays)."""
        k = _queue_keys(queue)
        labels = cast(dict[bytes, bytes], await self._redis.hgetall(k[5]))
        found: list[tuple[ScoreCard, dict[str, dict[str, object]]]] = []
        ids = list(labels)
        for start in range(0, len(ids), self.CHUNK):
            chunk = ids[start:start + self.CHUNK]
            cards = cast(list[bytes | None], await self._redis.hmget(k[8], chunk))
            found += [(ScoreCard.model_validate_json(card), orjson.loads(labels[item_id]))
                      for item_id, card in zip(chunk, cards, strict=True) if card is not None]
        return found

    async def newest_done(self, queues: Sequence[ReviewQueue]) -> list[float]:
        """When each queue's newest item was done (0 for none): what tells the agreement watch a
        queue has new labels to read, one round trip for every queue."""
        if not queues:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.zrevrange(_queue_keys(queue)[6], 0, 0, withscores=True)
            replies = await pipe.execute()
        return [float(reply[0][1]) if reply else 0.0 for reply in replies]

    async def recent_labelled(self, queues: Sequence[ReviewQueue], count: int
                              ) -> list[list[tuple[float, ScoreCard, dict[str, dict[str, object]]]]]:
        """Each queue's newest ``count`` done items (all their labels given), newest first: when
        each was done, what the machine said, its labels by reviewer key - two round trips."""
        if not queues:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.zrevrange(_queue_keys(queue)[6], 0, count - 1, withscores=True)
            done = await pipe.execute()
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue, items in zip(queues, done, strict=True):
                if items:
                    k = _queue_keys(queue)
                    pipe.hmget(k[8], [i for i, _ in items])
                    pipe.hmget(k[5], [i for i, _ in items])
            read = iter(await pipe.execute())
        found: list[list[tuple[float, ScoreCard, dict[str, dict[str, object]]]]] = []
        for items in done:
            cards, labels = (next(read), next(read)) if items else ([], [])
            found.append([(float(at), ScoreCard.model_validate_json(card), orjson.loads(label))
                          for (_, at), card, label in zip(items, cards, labels, strict=True)
                          if card is not None and label is not None])
        return found

    async def labelled_items(self, queue: ReviewQueue,
                             limit: int) -> list[tuple[ReviewItem, dict[str, dict[str, object]]]]:
        """Up to ``limit`` labelled items of the queue, oldest first, with their labels by reviewer
        key: the items walked in the order they were taken, a chunk at a time, until ``limit``."""
        k = _queue_keys(queue)
        found: list[tuple[ReviewItem, dict[str, dict[str, object]]]] = []
        start = 0
        while len(found) < limit:
            ids = cast(list[bytes], await self._redis.zrange(k[2], start, start + self.CHUNK - 1))
            if not ids:
                break
            start += len(ids)
            labels = cast(list[bytes | None], await self._redis.hmget(k[5], ids))
            labelled = [(i, lab) for i, lab in zip(ids, labels, strict=True) if lab is not None]
            if not labelled:
                continue
            documents = cast(list[bytes | None], await self._redis.hmget(k[0], [i for i, _ in labelled]))
            found += [(ReviewItem.model_validate_json(d), orjson.loads(lab))
                      for (_, lab), d in zip(labelled, documents, strict=True) if d is not None]
        return found[:limit]

    # --- the labels' outbox (consumers.label_export) ------------------------------------------

    async def pending_queues(self) -> list[QueueRef]:
        """The queues with label versions to export."""
        members = cast(list[bytes], await self._redis.zrange(keys.REVIEW_LABELS_PENDING, 0, -1))
        return [QueueRef(*m.decode().split("/", 1)) for m in members if b"/" in m]

    async def outbox(self, queue: ReviewQueue | QueueRef, count: int = 500) -> list[tuple[bytes, bytes]]:
        """The oldest label versions not yet exported: (stream id, label JSON)."""
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       await self._redis.xrange(_queue_keys(queue)[7], count=count))
        return [(entry_id, fields[b"label"]) for entry_id, fields in entries]

    async def exported(self, queue: ReviewQueue | QueueRef, entry_ids: Sequence[bytes]) -> None:
        """Label versions acknowledged by the broker leave the outbox."""
        if entry_ids:
            await self._redis.xdel(_queue_keys(queue)[7], *entry_ids)

    async def settle(self, queue: ReviewQueue | QueueRef) -> None:
        """A queue whose outbox was emptied leaves the pending set - and comes back at once if a
        label came meanwhile (its mark may have landed before this removal)."""
        await self._redis.zrem(keys.REVIEW_LABELS_PENDING, pending_member(queue))
        if await self._redis.xlen(_queue_keys(queue)[7]):
            await self._redis.zadd(keys.REVIEW_LABELS_PENDING, {pending_member(queue): 0})

    async def mark_unexported(self, queues: Sequence[ReviewQueue], now: float) -> int:
        """The sweep: queues whose outbox holds labels go (back) into the pending set."""
        if not queues:
            return 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for queue in queues:
                pipe.xlen(_queue_keys(queue)[7])
            lengths = await pipe.execute()
        waiting = {pending_member(q): now for q, n in zip(queues, lengths, strict=True) if n}
        if waiting:
            await self._redis.zadd(keys.REVIEW_LABELS_PENDING, waiting)
        return len(waiting)
