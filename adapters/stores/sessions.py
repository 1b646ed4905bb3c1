"""Session turns in Redis: what session-scope groups judge once a conversation goes quiet.

At ingest, a trace of a project with live session-scope groups is stored as a turn of its
session, the session's last activity is bumped, and so is the project's in the fleet's index of
projects with conversations open (``keys.SESSIONS_OPEN``). The sweeper then asks which projects
have conversations open, and of those, for the sessions quiet for at least some time with their
turns. Storing by traceId makes a redelivered trace one turn.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import structlog

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import ScriptPipeline
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


# KEYS: the projects with conversations open. ARGV: a project, its count of turn batches when the
# sweep read it. The project leaves unless a batch came since (a count, never a clock: workers'
# clocks differ).
_CLOSE = """
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
if seen and tonumber(seen) == tonumber(ARGV[2]) then redis.call('ZREM', KEYS[1], ARGV[1]) return 1 end
return 0
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
        self._close = redis.register_script(_CLOSE)

    async def add_turns(self, traces: list[Trace], now: float | None = None) -> None:
        """Store each trace as a turn of its session, in one pipelined round trip."""
        now = time.time() if now is None else now
        async with ScriptPipeline(self._redis) as pipe:
            # The project is open before its turns are stored: a sweep that finds its sessions all
            # gone after this cannot close it (``reindex``: only if no batch came since it read it).
            for project in {trace.project_id for trace in traces}:
                pipe.redis.zincrby(keys.SESSIONS_OPEN, 1, project)
            for trace in traces:
                assert trace.session_id is not None
                pipe.script(self._record,
                            [keys.session_turns(trace.project_id, trace.session_id),
                             keys.session_activity(trace.project_id)],
                            [trace.trace_id, trace.model_dump_json(by_alias=True), keys.SESSION_TURNS_TTL_S,
                             keys.SESSION_MAX_TURNS, now, trace.session_id])
            stored = (await pipe.execute())[-len(traces):] if traces else []
        for trace, ok in zip(traces, stored, strict=True):
            if not ok:
                log.warning("session has the maximum of turns stored; turn dropped",
                            session=trace.session_id, trace=trace.trace_id, max=keys.SESSION_MAX_TURNS)

    async def open_projects(self) -> dict[str, float]:
        """The projects with conversations open, each with its count of turn batches."""
        found: list[Any] = await self._redis.zrange(keys.SESSIONS_OPEN, 0, -1, withscores=True)
        return {project.decode(): float(seen) for project, seen in found}

    async def reindex(self, project_id: str, seen: float | None) -> None:
        """After a sweep of the project (``seen``: its count when the sweep read the open index,
        None when it was not there): with sessions left it stays, or comes back, in the index;
        with none it leaves, unless turns came since."""
        if await self._redis.zcard(keys.session_activity(project_id)):
            if seen is None:
                await self._redis.zadd(keys.SESSIONS_OPEN, {project_id: 0}, nx=True)
        elif seen is not None:
            await self._close(keys=[keys.SESSIONS_OPEN], args=[project_id, seen])

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
