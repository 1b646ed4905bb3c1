"""The assembly buffer: spans of unfinished OpenTelemetry traces, in Redis.

A trace is due once its root span came and no span for ``quiet_s``, or ``max_wait_s`` after its first span
(then partial). The one rule: ``add`` is idempotent and ``claim_due`` takes a trace under a lease, so any
worker can finish any trace, and one emitted twice is absorbed by the pipeline's dedupe. The operations,
keys and bounds: docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from adapters.stores.client import RedisClient
from adapters.stores.scripts import NOW_MS, ScriptPipeline
from scoring.otlp.mapping import BufferedSpan

SHARDS = 16  # fixed: changing it strands buffered traces under the old tags
PREFIX = "sgw:otlp"

_ADD = NOW_MS + """
local quiet, max_wait, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_spans, max_bytes, max_shard = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local max_project = tonumber(ARGV[7])
if tonumber(redis.call('HGET', KEYS[2], 'bytes') or '0') > max_shard then return {-1, 0, 0, {}} end
local added, dropped, late, refused = 0, 0, 0, {}
local a, k = 8, 4
while a <= #ARGV do
  local member, n = ARGV[a], tonumber(ARGV[a + 1])
  local spans, meta, done = KEYS[k], KEYS[k + 1], KEYS[k + 2]
  a, k = a + 2, k + 3
  local project = string.sub(member, 1, #member - 33)  -- a member is <project>/<32 hex digits>
  if redis.call('EXISTS', done) == 1 then
    late = late + n
    a = a + 3 * n
  elseif tonumber(redis.call('HGET', KEYS[2], 'p|' .. project) or '0') > max_project then
    table.insert(refused, member)  -- the project is over its share: its record is dead-lettered
    if redis.call('EXISTS', meta) == 1 then redis.call('HINCRBY', meta, 'dropped', n) end
    a = a + 3 * n
  else
    local count = tonumber(redis.call('HGET', KEYS[3], member .. '|n') or '0')
    local bytes = tonumber(redis.call('HGET', KEYS[3], member .. '|b') or '0')
    local got_n, got_bytes, trace_dropped, root = 0, 0, 0, false
    for _ = 1, n do
      local span_id, is_root, payload = ARGV[a], ARGV[a + 1], ARGV[a + 2]
      a = a + 3
      if redis.call('HEXISTS', spans, span_id) == 0 then
        if count + got_n >= max_spans or bytes + got_bytes + #payload > max_bytes then
          trace_dropped = trace_dropped + 1
        else
          redis.call('HSET', spans, span_id, payload)
          got_n, got_bytes = got_n + 1, got_bytes + #payload
        end
      end
      if is_root == '1' then root = true end
    end
    redis.call('HSETNX', meta, 'first', now)
    redis.call('HSET', meta, 'last', now)
    if root then redis.call('HSET', meta, 'root', 1) end
    if trace_dropped > 0 then redis.call('HINCRBY', meta, 'dropped', trace_dropped) end
    if tonumber(redis.call('HGET', meta, 'claimed') or '0') <= now then
      local due = tonumber(redis.call('HGET', meta, 'first')) + max_wait
      if redis.call('HGET', meta, 'root') == '1' then due = math.min(due, now + quiet) end
      redis.call('ZADD', KEYS[1], due, member)
    end
    redis.call('PEXPIRE', spans, ttl)
    redis.call('PEXPIRE', meta, ttl)
    redis.call('HINCRBY', KEYS[3], member .. '|n', got_n)
    redis.call('HINCRBY', KEYS[3], member .. '|b', got_bytes)
    redis.call('HINCRBY', KEYS[2], 'spans', got_n)
    redis.call('HINCRBY', KEYS[2], 'bytes', got_bytes)
    redis.call('HINCRBY', KEYS[2], 'p|' .. project, got_bytes)
    added, dropped = added + got_n, dropped + trace_dropped
  end
end
return {added, dropped, late, refused}
"""

# Forget a member's sizes (its keys are gone or about to be): shared by claim and finish.
_FORGET = """
local function forget(member)
  local n = tonumber(redis.call('HGET', KEYS[3], member .. '|n') or '0')
  local b = tonumber(redis.call('HGET', KEYS[3], member .. '|b') or '0')
  redis.call('HINCRBY', KEYS[2], 'spans', -n)
  redis.call('HINCRBY', KEYS[2], 'bytes', -b)
  local project = 'p|' .. string.sub(member, 1, #member - 33)
  if redis.call('HINCRBY', KEYS[2], project, -b) <= 0 then redis.call('HDEL', KEYS[2], project) end
  redis.call('HDEL', KEYS[3], member .. '|n', member .. '|b')
  redis.call('ZREM', KEYS[1], member)
  return n
end
"""

_CLAIM = _FORGET + NOW_MS + """
local prefix, lease = ARGV[3], tonumber(ARGV[2])
local out = {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))) do
  local meta = prefix .. 'meta:' .. member
  if redis.call('EXISTS', meta) == 0 then
    forget(member)  -- its keys ran out their TTL while no worker was running
  else
    redis.call('ZADD', KEYS[1], now + lease, member)
    redis.call('HSET', meta, 'claimed', now + lease)
    local m = redis.call('HMGET', meta, 'first', 'last', 'root', 'dropped')
    table.insert(out, {member, m[1], m[2], m[3] or '0', m[4] or '0',
                       redis.call('HVALS', prefix .. 'spans:' .. member)})
  end
end
return {now, redis.call('HGET', KEYS[2], 'spans') or '0', redis.call('HGET', KEYS[2], 'bytes') or '0',
        redis.call('ZCARD', KEYS[1]), out}
"""

_FINISH = _FORGET + """
local prefix, done_ttl = ARGV[1], ARGV[2]
local late = 0
for i = 3, #ARGV, 2 do
  local member, claimed = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('EXISTS', prefix .. 'meta:' .. member) == 1 then
    late = late + math.max(0, forget(member) - claimed)  -- spans that came after the claim
    redis.call('DEL', prefix .. 'meta:' .. member, prefix .. 'spans:' .. member)
  end
  redis.call('SET', prefix .. 'done:' .. member, 1, 'EX', done_ttl)
end
return late
"""


@dataclass(frozen=True)
class AddResult:
    added: int
    dropped: int  # over a trace's bounds
    late: int  # for traces already emitted
    full: bool  # the buffer is over its total bound: nothing of the refused shards was stored
    refused: frozenset[str] = frozenset()  # members of projects over their share: not stored


@dataclass(frozen=True)
class DueTrace:
    """A claimed trace, ready to assemble and emit."""

    member: str
    shard: int
    spans: list[BufferedSpan]
    complete: bool  # its root arrived and it went quiet (else: assembled at max wait)
    dropped: int
    first_seen: float  # epoch seconds (Redis clock) of its first and last span
    last_seen: float
    claimed_at: float


@dataclass(frozen=True)
class BufferSize:
    traces: int = 0
    spans: int = 0
    bytes: int = 0


def member_of(span: BufferedSpan) -> str:
    return f"{span.project_id}/{span.trace_id}"


def shard_of(member: str) -> int:
    return int.from_bytes(hashlib.blake2b(member.encode(), digest_size=8).digest(), "big") % SHARDS


def shard_prefix(prefix: str, shard: int) -> str:
    return f"{prefix}:{{otlp-{shard}}}:"


class OtlpBuffer:
    def __init__(self, redis: RedisClient, *, quiet_s: float = 5.0, max_wait_s: float = 300.0, lease_s: float = 30.0,
                 max_spans: int = 1000, max_trace_bytes: int = 1 << 20, max_total_bytes: int = 256 << 20,
                 max_project_bytes: int | None = None, ttl_s: float = 6 * 3600, done_ttl_s: int = 6 * 3600,
                 prefix: str = PREFIX) -> None:
        self._redis = redis
        self._prefix = prefix
        self._quiet_ms, self._max_wait_ms = int(quiet_s * 1000), int(max_wait_s * 1000)
        self._lease_ms, self._ttl_ms = int(lease_s * 1000), int(max(ttl_s, 2 * max_wait_s) * 1000)
        self._max_spans, self._max_trace_bytes = max_spans, max_trace_bytes
        self._max_shard_bytes = max(1, max_total_bytes // SHARDS)
        self._max_project_shard_bytes = max(1, (max_project_bytes or max_total_bytes // 4) // SHARDS)
        self._done_ttl_s = done_ttl_s
        self._add = redis.register_script(_ADD)
        self._claim = redis.register_script(_CLAIM)
        self._finish = redis.register_script(_FINISH)
        self.size = BufferSize()  # as of the last claim sweep

    async def add(self, spans: list[BufferedSpan]) -> AddResult:
        """Buffer ``spans`` (any traces, any projects): one pipelined script call per shard."""
        by_shard: dict[int, dict[str, list[BufferedSpan]]] = defaultdict(lambda: defaultdict(list))
        for span in spans:
            member = member_of(span)
            by_shard[shard_of(member)][member].append(span)
        if not by_shard:
            return AddResult(0, 0, 0, False)
        async with ScriptPipeline(self._redis) as pipe:
            for shard, members in by_shard.items():
                p = shard_prefix(self._prefix, shard)
                keys = [f"{p}due", f"{p}stats", f"{p}sizes"]
                args: list[Any] = [self._quiet_ms, self._max_wait_ms, self._ttl_ms, self._max_spans,
                                   self._max_trace_bytes, self._max_shard_bytes, self._max_project_shard_bytes]
                for member, items in members.items():
                    keys += [f"{p}spans:{member}", f"{p}meta:{member}", f"{p}done:{member}"]
                    args += [member, len(items)]
                    for item in items:
                        args += [item.span.span_id, "1" if item.is_root else "0", item.model_dump_json(by_alias=True)]
                pipe.script(self._add, keys, args)
            replies = await pipe.execute()
        full = any(int(r[0]) < 0 for r in replies)
        return AddResult(added=sum(max(0, int(r[0])) for r in replies), dropped=sum(int(r[1]) for r in replies),
                         late=sum(int(r[2]) for r in replies), full=full,
                         refused=frozenset(_text(m) for r in replies for m in r[3]))

    async def claim_due(self, limit_per_shard: int = 100) -> list[DueTrace]:
        """Due traces of every shard, each under a lease: one pipelined round trip."""
        async with ScriptPipeline(self._redis) as pipe:
            for shard in range(SHARDS):
                p = shard_prefix(self._prefix, shard)
                pipe.script(self._claim, [f"{p}due", f"{p}stats", f"{p}sizes"], [limit_per_shard, self._lease_ms, p])
            replies = await pipe.execute()
        due: list[DueTrace] = []
        traces = spans = size = 0
        for shard, (now_ms, shard_spans, shard_bytes, shard_traces, claimed) in enumerate(replies):
            spans, size, traces = spans + int(shard_spans), size + int(shard_bytes), traces + int(shard_traces)
            for member, first, last, root, dropped, payloads in claimed:
                items = _spans(payloads)
                last_ms = int(last)
                due.append(DueTrace(
                    member=_text(member), shard=shard, spans=items, dropped=int(dropped),
                    complete=_text(root) == "1" and last_ms + self._quiet_ms <= int(now_ms),
                    first_seen=int(first) / 1000, last_seen=last_ms / 1000, claimed_at=int(now_ms) / 1000))
        self.size = BufferSize(traces=traces, spans=spans, bytes=size)
        return due

    async def finish(self, emitted: list[DueTrace]) -> int:
        """Forget emitted traces and mark them emitted; returns the spans that came after the
        claim (late: not scored)."""
        by_shard: dict[int, list[Any]] = defaultdict(list)
        for trace in emitted:
            by_shard[trace.shard] += [trace.member, len(trace.spans)]
        if not by_shard:
            return 0
        async with ScriptPipeline(self._redis) as pipe:
            for shard, args in by_shard.items():
                p = shard_prefix(self._prefix, shard)
                pipe.script(self._finish, [f"{p}due", f"{p}stats", f"{p}sizes"], [p, self._done_ttl_s, *args])
            return sum(int(r) for r in await pipe.execute())


def _spans(payloads: list[bytes]) -> list[BufferedSpan]:
    spans = []
    for payload in payloads:
        try:
            spans.append(BufferedSpan.model_validate_json(payload))
        except ValidationError:
            continue  # written by this module, so only a foreign writer could cause it
    return spans


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
