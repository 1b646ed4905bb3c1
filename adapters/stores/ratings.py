"""Ratings history, groups' latest results and sessions' latest verdicts: one module by design, written together.

A batch's results are counted into one bucket per chart window (1h, 24h, 7d, 30d) and kept among their
groups' latest results in one pipelined round trip. The one rule: a group costs a bounded number of keys
however busy it is, each bucket expiring once no window can show it. The buckets: docs/design-notes.md.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import orjson

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import ScriptPipeline
from scoring.prices import NANOS
from scoring.results import HistoryEntry

# KEYS: a group's buckets (one per chart window), then, optionally, its latest results list and
# that list's index: rating id -> its seq (a sorted set) and rating id -> its judge calls (a hash).
# ARGV: count, scored, sum, min, max, below, noscore, skipped, matched; the number of buckets and one TTL
# per bucket; then, with the list: the length kept, its TTL, how often the index is trimmed (in
# seqs: keys.RESULTS_INDEX_TRIM_EVERY), and per result (oldest first) its
# document, whether it is below the threshold ("1"/"0"), its rating id and its judge calls (JSON,
# or ""). One call counts a whole batch's results of one group into its buckets (the worker
# aggregates first) and keeps their documents: the keys share the group's hash tag, so one
# command per group and batch, on Redis Cluster too.
# "skipped" counts pairs sampled in but not scored for want of judge budget: no result, so
# not in "count", but shown beside "noscore" so that a starved group is seen, not silent.
# "matched" counts traces (session turns) that passed the group's filter, sampled or not: the
# traffic the group is aimed at, beside what it scored.
# The index is trimmed by seq, below the list's oldest kept, whenever a push carries the seq past
# a multiple of RESULTS_INDEX_TRIM_EVERY: whatever trimmed the list (this script, an older
# version's, an eviction), nothing of it outlives the list by more than that many seqs. A result recorded
# again under the same id (a redelivery) moves its seq up, so trimming the older copy keeps it.
# Last of all (``_trailer``): the spend's (field, delta) pairs added to every bucket ("spent",
# "calls", "tokens", "cost", "cost:<ref id>", "unpriced"), their number, and the batch's once
# TTL - with, when it is not 0, the batch's once key as the last KEY: a batch counted already (a
# replay after a connection lost mid-pipeline) counts nothing again.
_RECORD = """
local once_ttl, spends = tonumber(ARGV[#ARGV]), tonumber(ARGV[#ARGV - 1])
local nkeys, nargv = #KEYS, #ARGV - 2 - 2 * spends
if once_ttl > 0 then
  nkeys = nkeys - 1
  if not redis.call('SET', KEYS[#KEYS], '1', 'NX', 'EX', once_ttl) then return -1 end
end
local fields = {'count', 'scored', 'sum', 'min', 'max', 'below', 'noscore', 'skipped', 'matched'}
local count, scored, sum = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local low, high = tonumber(ARGV[4]), tonumber(ARGV[5])
local buckets = tonumber(ARGV[10])
for i = 1, buckets do
  local key = KEYS[i]
  local v = redis.call('HMGET', key, unpack(fields))
  local new = {'count', (tonumber(v[1]) or 0) + count}
  if scored > 0 then
    local old_low, old_high = tonumber(v[4]), tonumber(v[5])
    table.insert(new, 'scored'); table.insert(new, (tonumber(v[2]) or 0) + scored)
    table.insert(new, 'sum'); table.insert(new, string.format('%.17g', (tonumber(v[3]) or 0) + sum))
    if (not old_low) or low < old_low then table.insert(new, 'min'); table.insert(new, ARGV[4]) end
    if (not old_high) or high > old_high then table.insert(new, 'max'); table.insert(new, ARGV[5]) end
  end
  for f = 6, 9 do
    if tonumber(ARGV[f]) > 0 then
      table.insert(new, fields[f]); table.insert(new, (tonumber(v[f]) or 0) + tonumber(ARGV[f]))
    end
  end
  redis.call('HSET', key, unpack(new))
  for s = nargv + 1, nargv + 2 * spends, 2 do redis.call('HINCRBY', key, ARGV[s], ARGV[s + 1]) end
  -- Every write sets 'count': a bucket without it is new. Its expiry is set once, when it is
  -- created (never before its start): it outlives every window that can show it.
  if not v[1] then redis.call('EXPIRE', key, ARGV[10 + i]) end
end
if nkeys > buckets then
  local list, seqs, calls, at = KEYS[buckets + 1], KEYS[buckets + 2], KEYS[buckets + 3], 11 + buckets
  local kept = tonumber(ARGV[at])
  local head = redis.call('LINDEX', list, 0)
  local seq = head and tonumber(string.match(head, '^(%d+):')) or 0
  if not head then redis.call('DEL', seqs, calls) end  -- a list begun again (expired, deleted): so is its index
  local every, before = tonumber(ARGV[at + 2]), seq
  local items, ranked, called = {}, {}, {}
  for i = at + 3, nargv, 4 do
    seq = seq + 1
    table.insert(items, seq .. ':' .. ARGV[i + 1] .. ':' .. ARGV[i])
    if ARGV[i + 2] ~= '' then
      table.insert(ranked, seq); table.insert(ranked, ARGV[i + 2])
      if ARGV[i + 3] ~= '' then table.insert(called, ARGV[i + 2]); table.insert(called, ARGV[i + 3]) end
    end
    if #items == 1000 then
      redis.call('LPUSH', list, unpack(items)); items = {}
      if #ranked > 0 then redis.call('ZADD', seqs, unpack(ranked)); ranked = {} end
      if #called > 0 then redis.call('HSET', calls, unpack(called)); called = {} end
    end
  end
  if #items > 0 then redis.call('LPUSH', list, unpack(items)) end
  if #ranked > 0 then redis.call('ZADD', seqs, unpack(ranked)) end
  if #called > 0 then redis.call('HSET', calls, unpack(called)) end
  redis.call('LTRIM', list, 0, kept - 1)
  if math.floor(seq / every) > math.floor(before / every) then
    local gone = redis.call('ZRANGEBYSCORE', seqs, '-inf', '(' .. (seq - kept + 1), 'LIMIT', 0, 5000)
    if #gone > 0 then
      redis.call('ZREM', seqs, unpack(gone))
      redis.call('HDEL', calls, unpack(gone))
    end
  end
  for _, key in ipairs({list, seqs, calls}) do redis.call('EXPIRE', key, ARGV[at + 1]) end
end
return buckets
"""

# KEYS: a group's latest results list and its index (seqs, calls). ARGV: a rating id. Returns
# {document, calls} of that rating while the list keeps it, else {}. The list's seqs run
# contiguously down from its head, so the rating's seq says where its document lies.
_ONE = """
local seq = redis.call('ZSCORE', KEYS[2], ARGV[1])
local head = redis.call('LINDEX', KEYS[1], 0)
if not seq or not head then return {} end
local item = redis.call('LINDEX', KEYS[1], tonumber(string.match(head, '^(%d+):')) - tonumber(seq))
if not item then return {} end
local found, doc = string.match(item, '^(%d+):%d:(.*)$')
if tonumber(found) ~= tonumber(seq) or string.find(doc, '{"id":"' .. ARGV[1] .. '"', 1, true) ~= 1 then return {} end
return {doc, redis.call('HGET', KEYS[3], ARGV[1]) or ''}
"""

# KEYS: a group's latest results list. ARGV: the cursor (the seq of the last result of the page
# before, "" for the first page), the page's length, "1" for results below the threshold only.
# Returns the next page's cursor ("" at the end), then the documents, newest first.
_LATEST = """
local list, limit, below = KEYS[1], tonumber(ARGV[2]), ARGV[3] == '1'
local head = redis.call('LINDEX', list, 0)
if not head then return {''} end
local index = 0
if ARGV[1] ~= '' then
  local after, newest = tonumber(ARGV[1]), tonumber(string.match(head, '^(%d+):'))
  -- Newer results pushed the cursor's down by as many places. A cursor past the newest is of a
  -- list that expired since and started again: that page had ended.
  if after > newest then return {''} end
  index = newest - after + 1
end
local found, cursor, read = {''}, '', math.max(limit, 100)
while #found <= limit do
  local items = redis.call('LRANGE', list, index, index + read - 1)
  for _, item in ipairs(items) do
    local seq, flag, doc = string.match(item, '^(%d+):(%d):(.*)$')
    if (not below) or flag == '1' then
      table.insert(found, doc)
      if #found > limit then cursor = seq; break end
    end
  end
  if #items < read or cursor ~= '' then break end
  index = index + read
end
found[1] = cursor
return found
"""


@dataclass(frozen=True, slots=True)
class SessionVerdict:
    session_id: str
    group_id: str
    rating: float | None
    justification: str
    scored_at: float


@dataclass(frozen=True, slots=True)
class Bucket:
    start: int
    count: int
    scored: int
    mean: float | None
    min: float | None
    max: float | None
    below: int
    no_score: int
    skipped: int = 0  # skipped for budget: sampled in, never scored
    matched: int = 0  # traces (turns) that passed the group's filter, sampled or not
    # What its judge calls cost (nanos, scoring.prices): in all and by member ref id, and the
    # calls whose cost is unknown (an unpriced model: the spend shown is a floor then).
    cost: int = 0
    member_cost: tuple[tuple[str, int], ...] = ()
    unpriced: int = 0
    judge_calls: int = 0  # the judge calls made, and the tokens they reported
    tokens: int = 0
    # The results counted with their spend (those recorded in a batch that made a judge call):
    # what a result's spend is averaged over - results from before spend was counted are not.
    spent: int = 0

    def cost_wire(self) -> dict[str, object]:
        return {"cost": self.cost / NANOS, "memberCost": {ref: n / NANOS for ref, n in self.member_cost},
                "unpricedCalls": self.unpriced, "judgeCalls": self.judge_calls, "tokens": self.tokens}


@dataclass(frozen=True, slots=True)
class RatingsHistory:
    group_id: str
    window: str
    bucket_seconds: int
    buckets: tuple[Bucket, ...]  # oldest first; empty buckets included, so a chart has no gaps

    @property
    def count(self) -> int:
        return sum(b.count for b in self.buckets)

    @property
    def scored(self) -> int:
        return sum(b.scored for b in self.buckets)

    @property
    def mean(self) -> float | None:
        total = sum((b.mean or 0) * b.scored for b in self.buckets)
        return total / self.scored if self.scored else None

    @property
    def below(self) -> int:
        return sum(b.below for b in self.buckets)

    @property
    def no_score(self) -> int:
        return sum(b.no_score for b in self.buckets)

    @property
    def skipped(self) -> int:
        return sum(b.skipped for b in self.buckets)

    @property
    def matched(self) -> int:
        return sum(b.matched for b in self.buckets)

    def spent(self) -> Bucket:
        """The window's spend in one bucket: its cost, by member, and the calls unpriced."""
        by_member: dict[str, int] = {}
        for b in self.buckets:
            for ref, n in b.member_cost:
                by_member[ref] = by_member.get(ref, 0) + n
        return Bucket(0, self.count, self.scored, None, None, None, 0, 0, cost=sum(b.cost for b in self.buckets),
                      member_cost=tuple(sorted(by_member.items())), unpriced=sum(b.unpriced for b in self.buckets),
                      judge_calls=sum(b.judge_calls for b in self.buckets), tokens=sum(b.tokens for b in self.buckets),
                      spent=sum(b.spent for b in self.buckets))

    def wire(self) -> dict[str, object]:
        return {
            "groupId": self.group_id, "window": self.window, "bucketSeconds": self.bucket_seconds,
            "count": self.count, "scored": self.scored, "mean": self.mean,
            "belowThreshold": self.below, "noScore": self.no_score, "skipped": self.skipped,
            "matched": self.matched, **(spend := self.spent()).cost_wire(),
            # what a result cost, on average: the window's spend over the results counted with it
            "costPerResult": spend.cost / NANOS / spend.spent if spend.spent else None,
            "buckets": [{"start": b.start, "count": b.count, "scored": b.scored, "mean": b.mean,
                         "min": b.min, "max": b.max, "belowThreshold": b.below, "noScore": b.no_score,
                         "skipped": b.skipped, "matched": b.matched, **b.cost_wire()}
                        for b in self.buckets],
        }


@dataclass
class _Aggregate:
    count: int = 0
    scored: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    below: int = 0
    no_score: int = 0
    skipped: int = 0
    matched: int = 0
    costs: dict[str, int] = field(default_factory=dict)  # nanos by member ref id
    unpriced: int = 0
    judge_calls: int = 0
    tokens: int = 0

    def add(self, entry: HistoryEntry) -> None:
        for ref, n in entry.costs:
            self.costs[ref] = self.costs.get(ref, 0) + n
        self.unpriced += entry.unpriced
        self.judge_calls += entry.judge_calls
        self.tokens += entry.tokens
        self.count += 1
        if entry.rating is None:
            self.no_score += 1
            return
        self.scored += 1
        self.total += entry.rating
        self.low = min(self.low, entry.rating)
        self.high = max(self.high, entry.rating)
        self.below += entry.below_threshold

    def args(self) -> list[int | str]:
        return [self.count, self.scored, repr(self.total), repr(self.low if self.scored else 0.0),
                repr(self.high if self.scored else 0.0), self.below, self.no_score, self.skipped, self.matched]


def _aggregate(entries: list[HistoryEntry]) -> dict[tuple[str, int], _Aggregate]:
    """Entries of one group in the same finest bucket share every coarser bucket too, so they
    are counted together in one script call."""
    finest = min(bucket_s for _, bucket_s in keys.RATING_WINDOWS.values())
    aggregates: dict[tuple[str, int], _Aggregate] = {}
    for entry in entries:
        slot = int(entry.at) // finest * finest
        aggregates.setdefault((entry.group_id, slot), _Aggregate()).add(entry)
    return aggregates


def _bucket_keys(group_id: str, at: float,
                 key: Callable[[str, int, int], str] = keys.rating_bucket) -> tuple[list[str], list[int]]:
    names, ttls = [], []
    for window_s, bucket_s in keys.RATING_WINDOWS.values():
        start = int(at) // bucket_s * bucket_s
        names.append(key(group_id, bucket_s, start))
        ttls.append(window_s + bucket_s)
    return names, ttls


def _spend(agg: _Aggregate | None) -> list[int | str]:
    """The judge calls' cost the script adds to its buckets: "cost" and "cost:<ref id>" in nanos,
    "unpriced" calls, the "calls" made and their "tokens", and the results counted with them
    ("spent"), as (field, delta) pairs. Nothing without calls: a batch of results that made none
    adds nothing to the averages (they err high, never low)."""
    if agg is None or not agg.judge_calls:
        return []
    total = sum(agg.costs.values())
    pairs: list[int | str] = ["spent", agg.count, "calls", agg.judge_calls]
    if agg.tokens:
        pairs += ["tokens", agg.tokens]
    if total:
        pairs += ["cost", total]
    for ref, n in agg.costs.items():
        pairs += [f"cost:{ref}", n]
    if agg.unpriced:
        pairs += ["unpriced", agg.unpriced]
    return pairs


def _trailer(names: list[str], group_id: str, batch: str | None, agg: _Aggregate | None = None,
             part: str = "") -> list[int | str]:
    """``_RECORD``'s last arguments - the spend, and the batch's once TTL - with the batch's once
    key added to ``names`` (each call of a batch its own: ``part``)."""
    spend = _spend(agg)
    if batch is not None:
        names.append(keys.once(group_id, f"{batch}:{part}"))
    return [*spend, len(spend) // 2, keys.ONCE_TTL_S if batch is not None else 0]


def _mark_active(pipe: ScriptPipeline, last: Mapping[str, float]) -> None:
    """Each group's last traffic in its shard's set (``keys.active_groups``): later only (GT)."""
    by_shard: dict[int, dict[str, float]] = {}
    for group_id, at in last.items():
        by_shard.setdefault(keys.shard_of(group_id), {})[group_id] = at
    for shard, members in by_shard.items():
        pipe.redis.zadd(keys.active_groups(shard), members, gt=True)


class RatingsStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = self.redis = redis
        self._record = redis.register_script(_RECORD)
        self._latest = redis.register_script(_LATEST)
        self._one = redis.register_script(_ONE)

    async def write(self, entries: list[HistoryEntry], sessions: list[SessionVerdict] = (),  # type: ignore[assignment]
                    batch: str | None = None) -> None:
        """Count ``entries`` into their buckets, keep their documents among their groups' latest
        results, and keep the latest session verdicts: one pipelined round trip for the batch.
        ``batch``: the batch's id, so that writing it again (a replay after a connection lost
        mid-pipeline) counts nothing twice - each script checks and records it as it counts."""
        if not entries and not sessions:
            return
        results: dict[str, list[bytes | int | str]] = {}
        for entry in entries:
            if entry.document:
                results.setdefault(entry.group_id, []).extend(
                    (entry.document, int(entry.below_threshold), entry.rating_id, entry.calls))
        async with ScriptPipeline(self._redis) as pipe:
            for (group_id, at), agg in _aggregate(entries).items():
                names, ttls = _bucket_keys(group_id, at)
                args: list[int | str | bytes] = [*agg.args(), len(names), *ttls]
                documents = results.pop(group_id, None)  # with the group's first buckets: one call
                if documents:
                    names += [keys.group_results(group_id), keys.group_results_seqs(group_id),
                              keys.group_judge_calls(group_id)]
                    args += [keys.RESULTS_KEPT, keys.RESULTS_TTL_S, keys.RESULTS_INDEX_TRIM_EVERY, *documents]
                args += _trailer(names, group_id, batch, agg, f"{at}")
                pipe.script(self._record, names, args)
            for (group_id, at), agg in _aggregate([e for e in entries if e.past]).items():
                names, ttls = _bucket_keys(group_id, at, keys.rating_bucket_past)
                args = [*agg.args(), len(names), *ttls]
                args += _trailer(names, group_id, batch, part=f"past:{at}")
                pipe.script(self._record, names, args)
            for verdict in sessions:
                key = keys.session_scores(verdict.session_id)
                pipe.redis.hset(key, verdict.group_id, orjson.dumps(asdict(verdict)))
                pipe.redis.expire(key, keys.SESSION_SCORES_TTL_S)
            last: dict[str, float] = {}
            for e in entries:
                if not e.past:  # a backfill's results are last week's traffic, not live
                    last[e.group_id] = max(e.at, last.get(e.group_id, e.at))
            _mark_active(pipe, last)
            await pipe.execute()

    async def write_counts(self, at: float, *, skipped: Mapping[str, int] = {},
                           matched: Mapping[str, int] = {}, traffic: Mapping[tuple[str, int], int] = {}) -> None:
        """Count pairs skipped for budget and traces that matched the group's filter (each by
        group) into the buckets of ``at``: one call per group; and each project's records by
        hour into its traffic index: one command per project and hour."""
        if not skipped and not matched and not traffic:
            return
        async with ScriptPipeline(self._redis) as pipe:
            for group_id in sorted(skipped.keys() | matched.keys()):
                names, ttls = _bucket_keys(group_id, at)
                counts = _Aggregate(skipped=skipped.get(group_id, 0), matched=matched.get(group_id, 0))
                pipe.script(self._record, names, [*counts.args(), len(names), *ttls, *_trailer(names, group_id, None)])
            if skipped or matched:
                _mark_active(pipe, dict.fromkeys(skipped.keys() | matched.keys(), at))
            for (project, hour), count in sorted(traffic.items()):
                pipe.redis.hincrby(keys.traffic(project), str(hour), count)
            for project in sorted({project for project, _ in traffic}):
                pipe.redis.expire(keys.traffic(project), keys.TRAFFIC_TTL_S)
            await pipe.execute()

    async def traffic(self, project_id: str, from_ms: int, to_ms: int) -> float:
        """The project's records stamped in ``[from_ms, to_ms)`` as its traffic index counted
        them (the hours at the window's ends in proportion to their overlap)."""
        bucket = keys.TRAFFIC_BUCKET_MS
        first, last = from_ms // bucket, max(from_ms, to_ms - 1) // bucket
        first = max(first, last - keys.TRAFFIC_TTL_S * 1000 // bucket - 1)  # older hours are gone from the index
        hours = list(range(first, last + 1))
        counts = await self._redis.hmget(keys.traffic(project_id), [str(h) for h in hours])
        total = 0.0
        for hour, count in zip(hours, counts, strict=True):
            if count:
                start, end = max(from_ms, hour * bucket), min(to_ms, (hour + 1) * bucket)
                total += int(count) * max(0, end - start) / bucket
        return total

    async def active(self, shards: Iterable[int], since: float, now: float | None = None) -> dict[str, float]:
        """The groups of ``shards`` with live traffic since ``since``, and when last (one round
        trip; the shards' members past ``keys.ACTIVE_KEPT_S`` are trimmed on the way)."""
        shards = sorted(shards)
        stale = (time.time() if now is None else now) - keys.ACTIVE_KEPT_S
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in shards:
                pipe.zremrangebyscore(keys.active_groups(shard), "-inf", stale)
                pipe.zrangebyscore(keys.active_groups(shard), since, "+inf", withscores=True)
            replies = await pipe.execute()
        found: dict[str, float] = {}
        for members in replies[1::2]:
            found.update({(m.decode() if isinstance(m, bytes) else m): float(at) for m, at in members})
        return found

    async def history(self, group_id: str, window: str = "7d", now: float | None = None) -> RatingsHistory:
        if window not in keys.RATING_WINDOWS:
            raise ValueError(f"window must be one of {', '.join(keys.RATING_WINDOWS)}, got {window!r}")
        window_s, bucket_s = keys.RATING_WINDOWS[window]
        last = int(time.time() if now is None else now) // bucket_s * bucket_s
        starts = list(range(last - window_s + bucket_s, last + 1, bucket_s))
        async with self._redis.pipeline(transaction=False) as pipe:
            for start in starts:
                pipe.hgetall(keys.rating_bucket(group_id, bucket_s, start))
            raw = await pipe.execute()
        return RatingsHistory(group_id, window, bucket_s,
                              tuple(_bucket(start, h) for start, h in zip(starts, raw, strict=True)))

    async def results(self, group_id: str, *, limit: int = 50, cursor: str | None = None,
                      below: bool = False) -> tuple[list[bytes], str | None]:
        """The group's latest results, newest first: up to ``limit`` rating documents (only those
        below the alert threshold with ``below``) older than ``cursor``, and the cursor of the
        next page (None at the end). At most RESULTS_KEPT are kept, so a page reads a bounded
        number of items."""
        answer = await self._latest(keys=[keys.group_results(group_id)],
                                    args=[cursor or "", limit, "1" if below else "0"])
        next_cursor, *documents = answer
        return documents, next_cursor.decode() if next_cursor else None

    async def result(self, group_id: str, rating_id: str) -> tuple[bytes, bytes] | None:
        """One of the group's latest results by its rating id: its document and its judge calls
        (b"" when it made none), or None once the list no longer keeps it."""
        found = await self._one(keys=[keys.group_results(group_id), keys.group_results_seqs(group_id),
                                      keys.group_judge_calls(group_id)], args=[rating_id])
        return (found[0], found[1]) if found else None

    async def results_by_id(self, group_id: str, rating_ids: Sequence[str]) -> dict[str, tuple[bytes, bytes]]:
        """``result`` for several rating ids of one group, in one round trip: those still kept."""
        names = [keys.group_results(group_id), keys.group_results_seqs(group_id), keys.group_judge_calls(group_id)]
        async with ScriptPipeline(self._redis) as pipe:
            for rating_id in rating_ids:
                pipe.script(self._one, names, [rating_id])
            found = await pipe.execute()
        return {rating_id: (f[0], f[1]) for rating_id, f in zip(rating_ids, found, strict=True) if f}

    async def oldest_kept(self, group_id: str) -> tuple[int, bytes | None]:
        """How many results the group's latest results hold, and the oldest one's document."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.llen(keys.group_results(group_id))
            pipe.lindex(keys.group_results(group_id), -1)
            length, oldest = await pipe.execute()
        return int(length), (oldest.split(b":", 2)[2] if oldest else None)

    async def session_scores(self, session_id: str) -> list[dict[str, object]]:
        """The latest verdict of each group on the session, as the SDK returns them."""
        raw = await self._redis.hgetall(keys.session_scores(session_id))
        verdicts = sorted((orjson.loads(v) for v in raw.values()), key=lambda v: v["group_id"])
        return [{"kind": f"scorer-group:{v['group_id']}", "rating": v["rating"],
                 "justification": v["justification"], "scoredAt": v["scored_at"]} for v in verdicts]


def _bucket(start: int, h: dict[bytes, bytes]) -> Bucket:
    def num(name: str) -> float | None:
        value = h.get(name.encode())
        return float(value) if value is not None else None

    scored = int(h.get(b"scored", 0))
    total = num("sum")
    return Bucket(start=start, count=int(h.get(b"count", 0)), scored=scored,
                  mean=(total / scored) if scored and total is not None else None,
                  min=num("min"), max=num("max"), below=int(h.get(b"below", 0)),
                  no_score=int(h.get(b"noscore", 0)), skipped=int(h.get(b"skipped", 0)),
                  matched=int(h.get(b"matched", 0)), cost=int(h.get(b"cost", 0)), unpriced=int(h.get(b"unpriced", 0)),
                  judge_calls=int(h.get(b"calls", 0)), tokens=int(h.get(b"tokens", 0)), spent=int(h.get(b"spent", 0)),
                  member_cost=tuple(sorted((k[5:].decode(), int(v)) for k, v in h.items() if k.startswith(b"cost:"))))
