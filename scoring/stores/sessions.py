"""Session turns in Redis: what session-scope groups judge once a conversation goes quiet.

At ingest, a trace of a project with live session-scope groups is stored as a turn of its
session, and the session's last activity is bumped. The sweeper then asks for sessions quiet for
at least some time and loads their turns. Storing by traceId makes a redelivered trace one turn.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from scoring.stores import keys
from scoring.stores.client import RedisClient
from scoring.stores.scripts import ScriptPipeline
from scoring.subjects import Trace

log = structlog.get_logger(__name__)

# Store a turn unless the session already holds the maximum (a redelivered turn is rewritten).
_RECORD_TURN = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[4]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[6])
return 1
"""


# ARGV[1] = the cut-off; ARGV[2..] = session ids to drop if no turn came after it.
_FORGET = """
for i = 2, #ARGV do
  local last = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if last and tonumber(last) <= tonumber(ARGV[1]) then redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return 1
"""


def _readable_turns(raw_turns: list[bytes]) -> list[Trace]:
    """The stored turns that still read as traces (``Trace`` reads a time without a zone as
    UTC); an unreadable one is left out, not raised."""
    turns = []
    for raw in raw_turns:
        try:
            turns.append(Trace.model_validate_json(raw))
        except ValueError:
            log.warning("a stored session turn is unreadable; left out", size=len(raw))
    return turns


@dataclass(frozen=True, slots=True)
class QuietSession:
    project_id: str
    session_id: str
    last_activity: float
    turns: list[Trace]


class SessionStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._record = redis.register_script(_RECORD_TURN)
        self._forget = redis.register_script(_FORGET)

    async def add_turns(self, traces: list[Trace], now: float | None = None) -> None:
        """Store each trace as a turn of its session, in one pipelined round trip."""
        now = time.time() if now is None else now
        async with ScriptPipeline(self._redis) as pipe:
            for trace in traces:
                assert trace.session_id is not None
                pipe.script(self._record,
                            [keys.session_turns(trace.project_id, trace.session_id),
                             keys.session_activity(trace.project_id)],
                            [trace.trace_id, trace.model_dump_json(by_alias=True), keys.SESSION_TURNS_TTL_S,
                             keys.SESSION_MAX_TURNS, now, trace.session_id])
            stored = await pipe.execute()
        for trace, ok in zip(traces, stored, strict=True):
            if not ok:
                log.warning("session has the maximum of turns stored; turn dropped",
                            session=trace.session_id, trace=trace.trace_id, max=keys.SESSION_MAX_TURNS)

    async def quiet(self, project_id: str, quiet_for_s: float, now: float | None = None,
                    offset: int = 0, limit: int = 200) -> list[QuietSession]:
        """A page of the sessions of a project whose last turn is at least ``quiet_for_s`` old,
        oldest first, with their turns (in two round trips)."""
        now = time.time() if now is None else now
        found: list[Any] = await self._redis.zrangebyscore(keys.session_activity(project_id), "-inf",
                                                           now - quiet_for_s, start=offset, num=limit,
                                                           withscores=True)
        if not found:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for session_id, _ in found:
                pipe.hvals(keys.session_turns(project_id, session_id.decode()))
            turn_lists = await pipe.execute()
        return [QuietSession(project_id, session_id.decode(), float(last), _readable_turns(turns))
                for (session_id, last), turns in zip(found, turn_lists, strict=True)]

    async def forget(self, project_id: str, session_ids: list[str], not_after: float) -> None:
        """Take sessions out of the activity index, unless a turn arrived after ``not_after``
        (a session that grows comes back with its next turn anyway)."""
        if not session_ids:
            return
        await self._forget(keys=[keys.session_activity(project_id)], args=[not_after, *session_ids])
