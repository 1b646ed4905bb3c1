"""Claims: dedupe of (group, subject) pairs and the judge-call budget, in one Redis round trip.

One Lua call per project of a batch (pipelined together) decides every pair of it atomically,
in the batch's order:

- the pair is already **done** (its outputs were acknowledged) or was **skipped** for budget:
  do nothing again - no budget, no second rating;
- another worker holds a live **lease** on it (e.g. after a rebalance): **busy**, wait for it
  to finish or for the lease to expire - never count it finished before;
- otherwise reserve the group's judge calls all or nothing from the project's budget window
  and take the lease (**claimed**), or, with too few calls left, mark it **exhausted**: the
  group is skipped whole, never scored on a partial panel.

Pairs live as fields of one hash per project and day (``keys.dedupe_claims``), so the call
costs a handful of commands whatever the batch's size: the server's clock, one HMGET and one
HSET per day touched, one GET and one INCRBY of the budget. A lease carries its own expiry
(server time), since fields cannot expire on their own. The budget key is shared with online
evaluators (same name, same fixed windows), and a project's keys share its hash tag, so the
script runs on Redis Cluster too.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from scoring.claim_request import ClaimRequest
from scoring.frozen import frozen
from scoring.stores import keys
from scoring.stores.client import RedisClient
from scoring.stores.scripts import ScriptPipeline

ClaimState = Literal["claimed", "done", "skipped", "busy", "exhausted"]

# Every script reads per hash: ``stored_fields(first, stride, key_offset)`` groups the pairs of
# ARGV (from ``first``, ``stride`` arguments each: hash index, field, ...) by hash and reads each
# hash with one HMGET (in chunks: Lua's stack is finite). Returns the fields per hash and what
# is stored, by "<hash index> <field>".
_STORED_FIELDS = """
local function stored_fields(first, stride, key_offset)
  local by_hash = {}
  for i = first, #ARGV, stride do
    local h = tonumber(ARGV[i])
    by_hash[h] = by_hash[h] or {}
    table.insert(by_hash[h], ARGV[i + 1])
  end
  local stored = {}
  for h, fields in pairs(by_hash) do
    for from = 1, #fields, 4000 do
      local chunk = {}
      for k = from, math.min(from + 3999, #fields) do table.insert(chunk, fields[k]) end
      local values = redis.call('HMGET', KEYS[h + key_offset], unpack(chunk))
      for k, field in ipairs(chunk) do stored[h .. ' ' .. field] = values[k] end
    end
  end
  return by_hash, stored
end
"""

# KEYS: the calls budget key, the tokens key, the claim hashes, then the verdict cache's buckets
# (newest first). ARGV: owner, lease ms, budget limit (-1: none), budget TTL, hash TTL, token limit
# (-1: none), "1" to fill (a backfill: see ``Claims``), the number of claim hashes, the number of
# verdict keys, the verdict keys, then per pair: hash index (1-based into KEYS[3..]), field, judge
# calls, token ceiling, the group's revision, and its verdict keys ("<index into the verdict
# keys>:<token ceiling>,..."; index 0: a call under way in the worker). Returns a flat list: per
# pair state, detail, the verdict keys it reserved calls for ("<index>,..."), the tokens it
# reserved; then per verdict key the verdict stored, or "".
_CLAIM = _STORED_FIELDS + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner, lease_ms, limit, token_limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[6])
local lease = 'lease:' .. (now + lease_ms) .. ':' .. owner
local fill = ARGV[7] == '1'
local hashes, verdict_keys = tonumber(ARGV[8]), tonumber(ARGV[9])
local first_pair = 10 + verdict_keys
local n = (#ARGV - first_pair + 1) / 6

-- 1. what is stored for every pair: one HMGET per hash
local _, stored = stored_fields(first_pair, 6, 2)

-- 1b. the verdicts paid for already: one HMGET per bucket, the newest first
local cached = {}
for b = 3 + hashes, #KEYS do
  for from = 1, verdict_keys, 4000 do
    local last = math.min(from + 3999, verdict_keys)
    local values = redis.call('HMGET', KEYS[b], unpack(ARGV, 9 + from, 9 + last))
    for j, value in ipairs(values) do
      if value and not cached[from + j - 1] then cached[from + j - 1] = value end
    end
  end
end

-- 2. decide in order: a pair twice in the batch sees its own first decision
local used, tokens_used = nil, nil
local reserved, tokens_reserved = 0, 0
local paid_in_batch = {}
local writes = {}
local out = {}
for i = 1, n do
  local at = first_pair + 6 * (i - 1)
  local h, field, want, tokens = tonumber(ARGV[at]), ARGV[at + 1], tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  local revision = '@' .. ARGV[at + 4]
  local leads = {}
  local slot = h .. ' ' .. field
  local current = stored[slot]
  local state, detail = nil, ''
  if current then
    if string.sub(current, 1, 5) == 'done:' then
      -- filling: done only under this revision (a changed rubric grades it again); a mark from
      -- before revisions were kept has none, and counts as done
      if not fill or string.sub(current, -string.len(revision)) == revision or not string.find(current, '@', 1, true)
      then state, detail = 'done', current end
    elseif string.sub(current, 1, 8) == 'skipped:' then
      if not fill then state, detail = 'skipped', current end  -- filling: a pair skipped has no rating yet
    else
      local expires = tonumber(string.match(current, '^lease:(%d+):'))
      if expires and expires > now then state, detail = 'busy', current end
    end
  end
  if not state then
    local value = lease
    state = 'claimed'
    -- the verdict cache: a call paid for already, or by an earlier pair of this batch, is not
    -- reserved again (a gates-first pair, reserving later, only reads what is paid for)
    for index, ceiling in string.gmatch(ARGV[at + 5], '(%d+):(%d+)') do
      index = tonumber(index)  -- 0: a call under way in the worker, nothing to read
      if index == 0 or cached[index] or paid_in_batch[index] then
        if want > 0 then
          want = want - 1
          tokens = math.max(0, tokens - tonumber(ceiling))
        end
      elseif want > 0 then
        table.insert(leads, index)
      end
    end
    if want > 0 or tokens > 0 then
      used = used or tonumber(redis.call('GET', KEYS[1]) or '0')
      tokens_used = tokens_used or tonumber(redis.call('GET', KEYS[2]) or '0')
      if (limit >= 0 and used + reserved + want > limit)
          or (token_limit >= 0 and tokens_used + tokens_reserved + tokens > token_limit) then
        -- filling: nothing is written, the job pauses and grades the pair in a later window
        value, state, detail = 'skipped:budget', 'exhausted', tostring(used + reserved)
        if fill then value = nil end
        leads, tokens = {}, 0
      else
        reserved = reserved + want
        tokens_reserved = tokens_reserved + tokens
        for _, index in ipairs(leads) do paid_in_batch[index] = true end
      end
    end
    if value then
      stored[slot] = value
      writes[h] = writes[h] or {}
      table.insert(writes[h], field)
      table.insert(writes[h], value)
    end
  end
  table.insert(out, state)
  table.insert(out, detail)
  table.insert(out, table.concat(leads, ','))
  table.insert(out, state == 'claimed' and tostring(tokens) or '0')
end
for index = 1, verdict_keys do
  table.insert(out, cached[index] or '')
end

-- 3. write: one HSET (in chunks) and one EXPIRE per hash; the budget once
for h, flat in pairs(writes) do
  for from = 1, #flat, 4000 do
    redis.call('HSET', KEYS[h + 2], unpack(flat, from, math.min(from + 3999, #flat)))
  end
  redis.call('EXPIRE', KEYS[h + 2], ARGV[5])
end
if reserved > 0 then
  redis.call('INCRBY', KEYS[1], reserved)
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
if tokens_reserved > 0 then
  redis.call('INCRBY', KEYS[2], tokens_reserved)
  redis.call('EXPIRE', KEYS[2], ARGV[4])
end
return out
"""

# Both scripts below read and write per hash, as the claim does: one HMGET and one HSET or HDEL
# per hash touched, whatever the number of pairs. A lease is this owner's if its value ends with
# ":<owner>".
_OWN_LEASES = _STORED_FIELDS + """
local function own_leases(first, suffix)
  local by_hash, stored = stored_fields(first, 2, 0)
  local mine = {}
  for slot, current in pairs(stored) do
    if current and string.sub(current, 1, 6) == 'lease:'
        and string.sub(current, -string.len(suffix)) == suffix then
      mine[slot] = true
    end
  end
  return by_hash, mine
end
"""

# KEYS: claim hashes. ARGV: owner, then per pair: hash index, field. Deletes this owner's leases.
_RELEASE = _OWN_LEASES + """
local by_hash, mine = own_leases(2, ':' .. ARGV[1])
local released = 0
for h, fields in pairs(by_hash) do
  local gone = {}
  for _, field in ipairs(fields) do
    if mine[h .. ' ' .. field] then table.insert(gone, field) end
  end
  for from = 1, #gone, 4000 do
    released = released + redis.call('HDEL', KEYS[h], unpack(gone, from, math.min(from + 3999, #gone)))
  end
end
return released
"""


# KEYS: claim hashes. ARGV: owner, lease ms, then per pair: hash index, field. Per pair 1 when
# this owner still holds its lease (renewed from now, even if it had run out while no one took
# the pair), 0 when the pair is done or another worker's.
_CONFIRM = _OWN_LEASES + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local renewed = 'lease:' .. (now + tonumber(ARGV[2])) .. ':' .. ARGV[1]
local by_hash, mine = own_leases(3, ':' .. ARGV[1])
local writes = {}
local out = {}
for i = 3, #ARGV, 2 do
  local h, field = tonumber(ARGV[i]), ARGV[i + 1]
  if mine[h .. ' ' .. field] then
    writes[h] = writes[h] or {}
    table.insert(writes[h], field)
    table.insert(writes[h], renewed)
    table.insert(out, 1)
  else
    table.insert(out, 0)
  end
end
for h, flat in pairs(writes) do
  for from = 1, #flat, 4000 do
    redis.call('HSET', KEYS[h], unpack(flat, from, math.min(from + 3999, #flat)))
  end
end
return out
"""


# Judge calls decided while a pair is scored (``PairSpend``): a gates-first group's judges once its
# cheap gates passed, and each retry. KEYS: the calls budget key, the tokens key, the pair's claim
# hash. ARGV: owner, budget limit (-1: none), budget TTL, calls, the pair's field, "1" to mark the
# pair skipped for budget when refused (still this owner's lease) as a claim that finds the budget
# exhausted does, token limit (-1: none), token ceiling of the calls.
_RESERVE = """
local limit, calls = tonumber(ARGV[2]), tonumber(ARGV[4])
local token_limit, tokens = tonumber(ARGV[7]), tonumber(ARGV[8])
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local tokens_used = tonumber(redis.call('GET', KEYS[2]) or '0')
if (limit >= 0 and used + calls > limit) or (token_limit >= 0 and tokens_used + tokens > token_limit) then
  if ARGV[6] == '1' then
    local current = redis.call('HGET', KEYS[3], ARGV[5])
    local suffix = ':' .. ARGV[1]
    if current and string.sub(current, 1, 6) == 'lease:' and string.sub(current, -string.len(suffix)) == suffix then
      redis.call('HSET', KEYS[3], ARGV[5], 'skipped:budget')
    end
  end
  return 0
end
redis.call('INCRBY', KEYS[1], calls)
redis.call('EXPIRE', KEYS[1], ARGV[3])
if tokens > 0 then
  redis.call('INCRBY', KEYS[2], tokens)
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
return 1
"""


# KEYS: a project's claim hashes, then its token windows. ARGV: the done marks' TTL, the number
# of hashes, then per hash the number of its fields and their field, value pairs; then per token
# window the tokens to settle and its TTL. A batch's done marks and token settlements of one
# project (one hash tag) in one command, not an HSET and an EXPIRE per hash and window.
_MARK_DONE = """
local at, hashes = 3, tonumber(ARGV[2])
for h = 1, hashes do
  local n = tonumber(ARGV[at])
  for first = at + 1, at + 2 * n, 4000 do  -- unpack's limit (Lua's C stack, 8000): 2000 fields a call
    redis.call('HSET', KEYS[h], unpack(ARGV, first, math.min(first + 3999, at + 2 * n)))
  end
  redis.call('EXPIRE', KEYS[h], ARGV[1])
  at = at + 1 + 2 * n
end
for w = hashes + 1, #KEYS do
  redis.call('INCRBY', KEYS[w], ARGV[at])
  redis.call('EXPIRE', KEYS[w], ARGV[at + 1])
  at = at + 2
end
return hashes
"""


def claim_hash(request: ClaimRequest) -> str:
    """The hash a pair's claim is kept in: its project's, of its subject's day."""
    return keys.dedupe_claims(request.project_id, request.day)


def claim_field(request: ClaimRequest) -> str:
    """The pair's field in that hash."""
    return keys.dedupe_field(request.group_id, request.subject_key)


def done_mark(request: ClaimRequest, rating_id: str) -> str:
    """What a done pair keeps: its rating id, and the revision of the group that rated it."""
    return f"done:{rating_id}@{request.revision}" if request.revision else f"done:{rating_id}"


@frozen
class ClaimResult:
    state: ClaimState
    detail: str  # the stored value for done/busy ("done:<ratingId>"), budget used when exhausted
    # With verdict keys looked up: the claimed pair's keys it reserved a call for (this pair
    # pays for them), the tokens it reserved, and the verdicts found stored (key, entry).
    leads: tuple[str, ...] = ()
    tokens: int = 0
    cached: tuple[tuple[str, bytes], ...] = ()


# A pair's verdict cache keys to look up at claim time: (key, token ceiling of its call); a key of
# None is a call paid for elsewhere (under way in this process): nothing to look up or reserve.
VerdictLookup = Sequence[tuple[str | None, int]]


def new_owner() -> str:
    """A token naming this worker process in leases, unique across restarts."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Claims:
    """The claims of one kind of work. ``fill`` is a backfill's: a pair counts as done only when
    it was rated under its group's current revision (a changed rubric grades past traffic again,
    a re-run grades nothing twice), a pair once skipped for budget is graded, and a pair that
    finds the budget exhausted is left as it was (the job pauses and comes back to it)."""

    def __init__(self, redis: RedisClient, *, owner: str | None = None, lease_s: float = 120.0,
                 done_ttl_s: int = keys.DEDUPE_DONE_TTL_S, fill: bool = False) -> None:
        self._redis = redis
        self.fill = fill
        self.owner = owner or new_owner()
        self.lease_s = lease_s
        self.lease_ms = int(lease_s * 1000)
        self._done_ttl_s = done_ttl_s
        self._claim = redis.register_script(_CLAIM)
        self._release = redis.register_script(_RELEASE)
        self._confirm = redis.register_script(_CONFIRM)
        self._reserve = redis.register_script(_RESERVE)
        self._mark_done = redis.register_script(_MARK_DONE)

    def spend(self, request: ClaimRequest, reserve: ReserveCalls | None = None,
              tokens_reserved: int | None = None) -> PairSpend:
        """The pair's budget for the judge calls decided while it is scored (``scoring.ports.JudgeSpend``).
        ``reserve`` makes the reservation; the trace loop passes one that batches the pairs'.
        ``tokens_reserved``: what its claim reserved, when the verdict cache made it less than
        the request's ceiling."""
        return PairSpend(request, reserve or self.reserve, tokens_reserved)

    async def reserve(self, reservation: Reservation) -> bool:
        """One reservation alone (``reserve_many`` of one)."""
        (granted,) = await self.reserve_many([reservation])
        return granted

    async def reserve_many(self, reservations: Sequence[Reservation], now: float | None = None) -> list[bool]:
        """Reserve more judge calls (and, under a token budget, their token ceiling) for claimed
        pairs from their projects' windows: one script call each, one round trip for all. A
        refusal is False, and with ``skip_when_refused`` the pair is marked skipped for budget
        (never scored, as at claim time)."""
        if not reservations:
            return []
        now = time.time() if now is None else now
        async with ScriptPipeline(self._redis) as pipe:
            for r in reservations:
                request = r.request
                window_start = int(now) // request.budget_window_s * request.budget_window_s
                pipe.script(
                    self._reserve,
                    [keys.judge_budget(request.project_id, window_start),
                     keys.judge_tokens(request.project_id, window_start), claim_hash(request)],
                    [self.owner, -1 if request.budget_limit is None else request.budget_limit,
                     request.budget_window_s * 2, r.calls, claim_field(request), int(r.skip_when_refused),
                     -1 if request.token_limit is None else request.token_limit,
                     r.tokens if request.token_limit is not None else 0])
            replies = await pipe.execute()
        return [bool(reply) for reply in replies]

    async def claim_many(self, requests: list[ClaimRequest], now: float | None = None,
                         lookups: Sequence[VerdictLookup] | None = None,
                         verdict_buckets: Sequence[int] = ()) -> list[ClaimResult]:
        """Claim every pair of a batch in one round trip: one script call per project. With
        ``lookups`` (per request, its verdict cache keys) read in ``verdict_buckets``
        (``CachePolicy.reading``), each claimed pair reserves judge calls only for the keys not
        stored and not paid for by an earlier pair of the batch."""
        if not requests:
            return []
        now = time.time() if now is None else now
        # One call per project and budget (a batch's requests of a project share its budget).
        by_project: dict[tuple[str, int | None, int, int | None], list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            by_project[(r.project_id, r.budget_limit, r.budget_window_s, r.token_limit)].append(i)
        results: list[ClaimResult | None] = [None] * len(requests)
        looked_up: list[list[str]] = []  # per project: its verdict keys, in the script's order
        async with ScriptPipeline(self._redis) as pipe:
            for indexes in by_project.values():
                first = requests[indexes[0]]
                window_start = int(now) // first.budget_window_s * first.budget_window_s
                hashes: dict[str, int] = {}
                verdicts: dict[str, int] = {}
                args: list[str | int] = []
                for i in indexes:
                    r = requests[i]
                    spec = ",".join(f"{0 if key is None else verdicts.setdefault(key, len(verdicts) + 1)}:{ceiling}"
                                    for key, ceiling in lookups[i]) if lookups is not None else ""
                    args += [hashes.setdefault(claim_hash(r), len(hashes) + 1), claim_field(r), r.judge_calls,
                             r.judge_tokens, r.revision, spec]
                header: list[str | int] = [self.owner, self.lease_ms,
                                           -1 if first.budget_limit is None else first.budget_limit,
                                           first.budget_window_s * 2, self._done_ttl_s,
                                           -1 if first.token_limit is None else first.token_limit,
                                           int(self.fill), len(hashes), len(verdicts), *verdicts]
                looked_up.append(list(verdicts))
                buckets = [keys.judge_verdicts(first.project_id, b) for b in verdict_buckets] if verdicts else []
                pipe.script(self._claim, [keys.judge_budget(first.project_id, window_start),
                                          keys.judge_tokens(first.project_id, window_start), *hashes, *buckets],
                            header + args)
            replies = await pipe.execute()
        for indexes, reply, verdict_keys in zip(by_project.values(), replies, looked_up, strict=True):
            stored_verdicts = dict(zip(verdict_keys, reply[4 * len(indexes):], strict=True))
            for n, i in enumerate(indexes):
                leads = _text(reply[4 * n + 2])
                mine = lookups[i] if lookups is not None else ()
                found = tuple((key, value if isinstance(value, bytes) else value.encode()) for key, _ in mine
                              if key is not None and (value := stored_verdicts[key]))
                ours = tuple(verdict_keys[int(k) - 1] for k in leads.split(",")) if leads else ()
                results[i] = ClaimResult(state=_text(reply[4 * n]), detail=_text(reply[4 * n + 1]),  # type: ignore[arg-type]
                                         leads=ours, tokens=int(reply[4 * n + 3]), cached=found)
        return results  # type: ignore[return-value]

    async def mark_done(self, done: list[tuple[ClaimRequest, str]],
                        tokens: Sequence[tuple[ClaimRequest, int]] = (), now: float | None = None,
                        saved: Sequence[tuple[ClaimRequest, int, int]] = ()) -> None:
        """Mark pairs done with their rating ids, once their outputs are acknowledged. ``tokens``
        settles the pairs' judge tokens in their windows (the usage reported less the ceilings
        reserved); ``saved`` counts the (calls, tokens) the verdict cache saved them in their
        windows. One script call per project, pipelined: a round trip for the batch."""
        if not done and not tokens and not saved:
            return
        now = time.time() if now is None else now
        by_project: dict[str, tuple[dict[str, dict[str, str]], dict[tuple[str, int], int]]] = {}
        for request, rating_id in done:
            hashes, _ = by_project.setdefault(request.project_id, ({}, defaultdict(int)))
            hashes.setdefault(claim_hash(request), {})[claim_field(request)] = done_mark(request, rating_id)
        for request, delta in tokens:
            if delta:
                window_s = request.budget_window_s
                _, settle = by_project.setdefault(request.project_id, ({}, defaultdict(int)))
                settle[(keys.judge_tokens(request.project_id, int(now) // window_s * window_s), window_s)] += delta
        async with ScriptPipeline(self._redis) as pipe:
            for hashes, settle in by_project.values():
                args: list[str | int] = [self._done_ttl_s, len(hashes)]
                for fields in hashes.values():
                    args.append(len(fields))
                    for field, value in fields.items():
                        args += [field, value]
                for (_, window_s), delta in settle.items():
                    args += [delta, window_s * 2]
                pipe.script(self._mark_done, [*hashes, *(key for key, _ in settle)], args)
            for (key, window_s), (calls, spared) in _saved_by_window(saved, now).items():
                pipe.redis.hincrby(key, "calls", calls)
                pipe.redis.hincrby(key, "tokens", spared)
                pipe.redis.expire(key, window_s * 2)
            await pipe.execute()

    async def confirm(self, requests: list[ClaimRequest]) -> list[bool]:
        """Whether this worker still holds each pair's lease - renewed if so - right before it
        publishes: a worker that stalled (frozen, starved) past its lease may have lost the pair
        to another, which scored it since; publishing then would put a second value under the
        pair's rating id."""
        if not requests:
            return []
        by_project: dict[str, list[int]] = defaultdict(list)
        for i, r in enumerate(requests):
            by_project[r.project_id].append(i)
        held = [False] * len(requests)
        async with ScriptPipeline(self._redis) as pipe:
            for indexes in by_project.values():
                hashes: dict[str, int] = {}
                args: list[str | int] = [self.owner, self.lease_ms]
                for i in indexes:
                    args += [hashes.setdefault(claim_hash(requests[i]), len(hashes) + 1), claim_field(requests[i])]
                pipe.script(self._confirm, list(hashes), args)
            replies = await pipe.execute()
        for indexes, reply in zip(by_project.values(), replies, strict=True):
            for n, i in enumerate(indexes):
                held[i] = bool(reply[n])
        return held

    async def release(self, requests: list[ClaimRequest]) -> None:
        """Give up leases this worker still holds (shutdown with work unfinished), so another
        worker need not wait for them to expire."""
        if not requests:
            return
        by_project: dict[str, list[ClaimRequest]] = defaultdict(list)
        for r in requests:
            by_project[r.project_id].append(r)
        async with ScriptPipeline(self._redis) as pipe:
            for mine in by_project.values():
                hashes: dict[str, int] = {}
                args: list[str | int] = [self.owner]
                for r in mine:
                    args += [hashes.setdefault(claim_hash(r), len(hashes) + 1), claim_field(r)]
                pipe.script(self._release, list(hashes), args)
            await pipe.execute()

    async def stored(self, request: ClaimRequest) -> str:
        """What is kept for a pair ("lease:...", "done:<ratingId>[@<revision>]", "skipped:budget"), or ""."""
        value = await self._redis.hget(claim_hash(request), claim_field(request))
        return _text(value) if value is not None else ""

    async def budget_used(self, project_id: str, window_s: int, now: float | None = None) -> int:
        now = time.time() if now is None else now
        value = await self._redis.get(keys.judge_budget(project_id, int(now) // window_s * window_s))
        return int(value or 0)

    async def saved(self, project_id: str, window_s: int, now: float | None = None) -> tuple[int, int]:
        """The judge calls and tokens the verdict cache saved the project in the window."""
        now = time.time() if now is None else now
        calls, tokens = await self._redis.hmget(keys.judge_saved(project_id, int(now) // window_s * window_s),
                                                ["calls", "tokens"])
        return int(calls or 0), int(tokens or 0)

    async def tokens_used(self, project_id: str, window_s: int, now: float | None = None) -> int:
        """Judge tokens of the window: the usage of calls settled, plus the ceilings of calls not
        settled yet (in flight, or whose worker stopped before it could settle them)."""
        now = time.time() if now is None else now
        value = await self._redis.get(keys.judge_tokens(project_id, int(now) // window_s * window_s))
        return int(value or 0)


@dataclass(frozen=True, slots=True)
class Reservation:
    """Judge calls (and their token ceiling) a claimed pair asks for while it is scored."""

    request: ClaimRequest
    calls: int
    tokens: int
    skip_when_refused: bool  # a gates-first panel's: refused, the pair is skipped for budget


# How a pair's reservation reaches Redis: ``Claims.reserve`` alone, or - the pair protocol's -
# batched with other pairs' into one ``reserve_many`` and riding out a Redis outage. The one
# callback on the budget path, and on purpose: the budget's arithmetic is the store's, but
# batching across pairs and the outage rule are the loop's (``consumers``), and the core's panel
# sees neither (``scoring.ports.JudgeSpend``).
ReserveCalls = Callable[[Reservation], Awaitable[bool]]


class PairSpend:
    """One claimed pair's ``JudgeSpend``: its reservations go to its project's budget window, and
    it remembers the token ceilings reserved, so that ``settlement`` can turn them into the usage
    the judges reported."""

    def __init__(self, request: ClaimRequest, reserve: ReserveCalls, tokens_reserved: int | None = None) -> None:
        self.request, self._reserve_one = request, reserve
        self.counts_tokens = request.token_limit is not None
        claimed = request.judge_tokens if tokens_reserved is None else tokens_reserved
        self.tokens_reserved = claimed if self.counts_tokens else 0

    async def reserve_panel(self, calls: int, tokens: int) -> bool:
        return await self._reserve(calls, tokens, skip_when_refused=True)

    async def reserve_retry(self, tokens: int) -> bool:
        return await self._reserve(1, tokens, skip_when_refused=False)

    async def _reserve(self, calls: int, tokens: int, *, skip_when_refused: bool) -> bool:
        tokens = tokens if self.counts_tokens else 0
        granted = await self._reserve_one(Reservation(self.request, calls, tokens, skip_when_refused))
        self.tokens_reserved += tokens if granted else 0
        return granted

    def settlement(self, tokens_reported: int) -> int:
        """What to add to the window's tokens once the pair is done: the usage reported less
        the ceilings reserved (negative under a token budget: the ceiling overshoots)."""
        return tokens_reported - self.tokens_reserved


def _saved_by_window(saved: Sequence[tuple[ClaimRequest, int, int]],
                     now: float) -> dict[tuple[str, int], tuple[int, int]]:
    """(calls, tokens) saved, summed by the project's window key (and its length)."""
    by: dict[tuple[str, int], tuple[int, int]] = {}
    for request, calls, tokens in saved:
        window_s = request.budget_window_s
        key = (keys.judge_saved(request.project_id, int(now) // window_s * window_s), window_s)
        had = by.get(key, (0, 0))
        by[key] = (had[0] + calls, had[1] + tokens)
    return by


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
