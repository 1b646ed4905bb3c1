"""Backfill jobs in Redis: each job's request, its state, and the indexes a worker and the API read.

A job is its document as created (never rewritten) and its state, a hash changed one field at a time. The
one rule: a status moves only by a script that refuses to move an ended job (a cancel is never undone),
and a project's cap of jobs not ended is checked and taken in one script. The keys and the cap:
docs/design-notes.md.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import orjson

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.scripts import LEASE
from scorer_groups.api_models import BACKFILL_ENDED, BackfillCreate, BackfillJob, BackfillProgress
from scoring.errors import Conflict, InvalidDocument, NotFound
from scoring.models import ScorerGroup

JOBS_KEPT_S = 30 * 86_400  # an ended job is kept for a month: its progress stays readable (an active one: always)
MAX_ACTIVE_JOBS = 3  # a project's jobs not ended: each reads the shared topic again
PLACE_GRACE_S = 60  # a place whose job has no document this long after it was taken: a start that stopped
CLOCK_SKEW_S = 300  # a ``to`` this far ahead of the server's clock is now (a client's "until now")
COUNTS = ("tracesRead", "pairsScored", "pairsSkipped", "judgeCalls")

# KEYS: a project's jobs not ended (job id -> when it took its place). ARGV: the most, a new job's
# id, now (s). Returns the jobs holding places, with when each took its place, as they were before
# this call; when fewer than the most, the new job takes a place too.
_TAKE_PLACE = """
local held = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
if #held / 2 < tonumber(ARGV[1]) then redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2]) end
return held
"""

# KEYS: a job's state hash. ARGV: the new status, the statuses it may move from (space-separated;
# a job without a status yet is "queued"), then field, value pairs to set with it. 1 if moved.
_MOVE = """
local current = redis.call('HGET', KEYS[1], 'status') or 'queued'
if not string.find(' ' .. ARGV[2] .. ' ', ' ' .. current .. ' ', 1, true) then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[1], unpack(ARGV, 3))
return 1
"""


# KEYS: a job's state hash. ARGV: the job's most judge calls (-1: none), then the calls of each
# pair in order. Reserves the longest prefix of pairs that fits, all or nothing per pair, and
# returns its length.
_RESERVE_CALLS = """
local cap = tonumber(ARGV[1])
local used = tonumber(redis.call('HGET', KEYS[1], 'judgeCalls') or '0')
local total, fits = 0, 0
for i = 2, #ARGV do
  local calls = tonumber(ARGV[i])
  if cap >= 0 and used + total + calls > cap then break end
  total, fits = total + calls, fits + 1
end
if total > 0 then redis.call('HINCRBY', KEYS[1], 'judgeCalls', total) end
return fits
"""


def backfill_sample(group: ScorerGroup, request: BackfillCreate, now: datetime | None = None) -> float:
    """The job's sample rate, once the request is known to fit the group; else InvalidDocument
    naming every field refused (the API's 400, the CLI's error line)."""
    refused = []
    if group.online is not None and group.online.scope == "session":
        refused.append("scope: a session-scope group cannot be backfilled: a conversation's turns are spread over "
                       "partitions read by different workers at different times, and a window cuts conversations "
                       "in two (see the README, Backfills)")
    if request.to > (now or datetime.now(UTC)) + timedelta(seconds=CLOCK_SKEW_S):
        refused.append("to: must not be in the future (a backfill grades traffic that already passed)")
    rate = request.sample_rate if request.sample_rate is not None else (
        group.online.sample_rate if group.online else None)
    if rate is None:
        refused.append("sampleRate: required: the group has no online profile to take its sample from")
    if refused:
        raise InvalidDocument.of(refused)
    assert rate is not None
    return rate


class BackfillStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._take_place = redis.register_script(_TAKE_PLACE)

    async def start(self, group: ScorerGroup, request: BackfillCreate) -> BackfillJob:
        """Check the request against the group (``backfill_sample``) and queue the job - its
        ``to`` at most now (a client's clock a little ahead is not refused)."""
        rate = backfill_sample(group, request)
        now = datetime.now(UTC)
        if request.to > now:
            request = request.model_copy(update={"to": now})
        return await self.create(group.id, group.project_id, request, rate)

    async def create(self, group_id: str, project_id: str, request: BackfillCreate, sample_rate: float) -> BackfillJob:
        """Queue the job, once it has a place among its project's (Conflict at ``MAX_ACTIVE_JOBS``:
        every job reads the shared topic again)."""
        now = datetime.now(UTC)
        job = BackfillJob(id=f"bf-{uuid.uuid4().hex[:16]}", group_id=group_id, project_id=project_id,
                          status="queued", from_=request.from_, to=request.to, sample_rate=sample_rate,
                          max_judge_calls=request.max_judge_calls, alerts=request.alerts, created_at=now,
                          updated_at=now)
        held = await self._place(job)
        if len(held) >= MAX_ACTIVE_JOBS and await self._give_back_stale_places(project_id, held):
            held = await self._place(job)
        if len(held) >= MAX_ACTIVE_JOBS:
            raise Conflict(f"the project has {len(held)} backfills not ended (at most {MAX_ACTIVE_JOBS}): "
                           f"wait for one, or cancel one ({', '.join(sorted(held))})")
        try:
            async with self._redis.pipeline(transaction=True) as pipe:  # the job's keys: one slot
                pipe.set(keys.backfill(job.id), orjson.dumps(job.model_dump(mode="json", by_alias=True)))
                pipe.hset(keys.backfill_progress(job.id), mapping={"status": "queued", "updatedAt": now.isoformat()})
                await pipe.execute()
            async with self._redis.pipeline(transaction=False) as pipe:  # then the indexes that find it
                pipe.zadd(keys.group_backfills(group_id), {job.id: time.time()})
                pipe.sadd(keys.BACKFILLS_ACTIVE, job.id)
                await pipe.execute()
        except BaseException:  # not queued: its place is the project's again
            await self._redis.zrem(keys.project_backfills(project_id), job.id)
            raise
        return job

    async def _place(self, job: BackfillJob) -> dict[str, float]:
        """The places of the project's jobs before this one (``_TAKE_PLACE``): this one has taken
        a place too when they are fewer than ``MAX_ACTIVE_JOBS``."""
        held = await self._take_place(keys=[keys.project_backfills(job.project_id)],
                                      args=[MAX_ACTIVE_JOBS, job.id, time.time()])
        return {_text(held[i]): float(held[i + 1]) for i in range(0, len(held), 2)}

    async def _give_back_stale_places(self, project_id: str, held: dict[str, float]) -> bool:
        """Give back the places of jobs that ended (a worker stopped between ending a job and
        giving its place back) or whose document never came (a start that stopped after taking
        its place, ``PLACE_GRACE_S`` ago): True if any was."""
        stale = []
        for job_id, taken_at in held.items():
            try:
                if (await self.get(job_id)).status in BACKFILL_ENDED:
                    stale.append(job_id)
            except NotFound:
                if taken_at < time.time() - PLACE_GRACE_S:
                    stale.append(job_id)
        if stale:
            await self._redis.zrem(keys.project_backfills(project_id), *stale)
        return bool(stale)

    async def get(self, job_id: str, project_id: str | None = None) -> BackfillJob:
        """The job with its state and progress; another project's is as if it did not exist (404)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.backfill(job_id))
            pipe.hgetall(keys.backfill_progress(job_id))
            pipe.hgetall(keys.backfill_parts(job_id))
            raw, state, parts = await pipe.execute()
        if not raw:
            raise NotFound(f"no backfill with id {job_id!r}")
        job = _job(raw, state, parts)
        if project_id is not None and job.project_id != project_id:
            raise NotFound(f"no backfill with id {job_id!r}")
        return job

    async def of_group(self, group_id: str, limit: int = 50) -> list[BackfillJob]:
        found = await self._redis.zrevrange(keys.group_backfills(group_id), 0, limit - 1)
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in found]
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in ids:
                pipe.get(keys.backfill(job_id))
                pipe.hgetall(keys.backfill_progress(job_id))
                pipe.hgetall(keys.backfill_parts(job_id))
            replies = await pipe.execute() if ids else []
        return [_job(*replies[i:i + 3]) for i in range(0, len(replies), 3) if replies[i]]

    async def cancel(self, job_id: str, project_id: str | None = None) -> BackfillJob:
        job = await self.get(job_id, project_id)
        parts = JobParts(self._redis)
        if not await parts.move(job_id, "cancelled", "queued running paused"):
            raise Conflict(f"backfill {job_id!r} has already ended ({(await self.get(job_id)).status})")
        await parts.ended(job_id)
        return await self.get(job.id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _job(raw: bytes, state: dict[bytes, bytes], parts: dict[bytes, bytes]) -> BackfillJob:
    """A job from its document, its state hash and its partitions' ranges."""
    job = BackfillJob.model_validate(orjson.loads(raw))
    fields = {_text(k): _text(v) for k, v in state.items()}
    status = fields.get("status", job.status)
    ranges = [orjson.loads(v) for v in parts.values()]
    total = sum(r["end"] - r["start"] for r in ranges)
    read = sum(r["next"] - r["start"] for r in ranges)
    fraction = read / total if total else (1.0 if status == "done" else 0.0)
    return job.model_copy(update={
        "status": status, "error": fields.get("error") or None,
        "notes": orjson.loads(fields["notes"]) if fields.get("notes") else job.notes,
        "resume_at": datetime.fromisoformat(fields["resumeAt"]) if fields.get("resumeAt") else None,
        "updated_at": datetime.fromisoformat(fields["updatedAt"]) if fields.get("updatedAt") else job.updated_at,
        "progress": BackfillProgress(fraction=round(fraction, 4),
                                     **{name: int(fields.get(name, 0)) for name in COUNTS})})


# --- What the runners share through Redis ------------------------------------------------------

PLAN_LOCK_S = 60  # one worker plans a job's ranges; another may try again after this


class JobParts:
    """A job's state as the runners change it: its ranges per partition, the offset each has
    reached and who reads each; its status; its judge calls."""

    def __init__(self, redis: RedisClient, lease_s: float = 30.0) -> None:
        self._redis = redis
        self.lease_s = lease_s  # a worker holds a partition of a job this long without renewing it
        self._move = redis.register_script(_MOVE)
        self._reserve_calls = redis.register_script(_RESERVE_CALLS)
        self._lease = redis.register_script(LEASE)

    async def move(self, job_id: str, status: str, from_statuses: str, **fields: str) -> bool:
        """Set the job's status if it is one of ``from_statuses`` (with ``fields``, e.g.
        resumeAt); False, and nothing changed, otherwise."""
        args = [status, from_statuses, "updatedAt", datetime.now(UTC).isoformat()]
        for name, value in fields.items():
            args += [name, value]
        return bool(await self._move(keys=[keys.backfill_progress(job_id)], args=args))

    async def try_plan(self, job_id: str, worker: str) -> bool:
        return bool(await self._redis.set(keys.backfill_plan_lock(job_id), worker, nx=True, ex=PLAN_LOCK_S))

    async def save_plan(self, job_id: str, ranges: dict[int, tuple[int, int]], notes: list[str]) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            for partition, (start, end) in ranges.items():  # never over a range read since (a late planner)
                pipe.hsetnx(keys.backfill_parts(job_id), str(partition), orjson.dumps({"start": start, "end": end,
                                                                                       "next": start}))
            await pipe.execute()
        await self.move(job_id, "running", "queued", **({"notes": orjson.dumps(notes).decode()} if notes else {}))

    async def parts(self, job_id: str) -> dict[int, dict[str, int]]:
        raw = await self._redis.hgetall(keys.backfill_parts(job_id))
        return {int(k): orjson.loads(v) for k, v in raw.items()}

    async def lease(self, job_id: str, partition: int, worker: str) -> bool:
        """Take (or renew) the partition for ``worker``: one reader per partition of a job."""
        return bool(await self._lease(keys=[keys.backfill_lease(job_id, partition)],
                                      args=[worker, int(self.lease_s * 1000)]))

    async def status(self, job_id: str) -> str:
        return _text(await self._redis.hget(keys.backfill_progress(job_id), "status") or b"queued")

    async def reserve_calls(self, job_id: str, cap: int | None, calls: list[int]) -> int:
        """Count the pairs' judge calls against the job's ``maxJudgeCalls``: how many of them, in
        order, fit (all of them without a cap)."""
        if not any(calls):
            return len(calls)
        fits = await self._reserve_calls(keys=[keys.backfill_progress(job_id)],
                                         args=[-1 if cap is None else cap, *calls])
        return int(fits)

    async def give_calls(self, job_id: str, calls: int) -> None:
        if calls:
            await self._redis.hincrby(keys.backfill_progress(job_id), "judgeCalls", -calls)

    async def advance(self, job_id: str, partition: int, next_offset: int, **progress: int) -> None:
        """The partition's reached offset, after its batch's pairs are done; and the job's counts
        (negative ones give back calls counted for pairs not scored)."""
        raw = await self._redis.hget(keys.backfill_parts(job_id), str(partition))
        if raw is None:
            return
        part = orjson.loads(raw)
        part["next"] = max(part["next"], next_offset)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.backfill_parts(job_id), str(partition), orjson.dumps(part))
            for name, count in progress.items():
                if count:
                    pipe.hincrby(keys.backfill_progress(job_id), name, count)
            await pipe.execute()

    async def progress(self, job_id: str) -> dict[str, int]:
        raw = await self._redis.hgetall(keys.backfill_progress(job_id))
        return {_text(k): int(v) for k, v in raw.items() if _text(k) in COUNTS}

    async def pause(self, job_id: str, resume_at: datetime) -> bool:
        return await self.move(job_id, "paused", "running", resumeAt=resume_at.isoformat())

    async def resume(self, job_id: str) -> bool:
        return await self.move(job_id, "running", "paused", resumeAt="")

    async def finish(self, job_id: str, status: str = "done", error: str | None = None,
                     note: str | None = None) -> None:
        fields = {"error": error} if error else {}
        if note:
            raw = await self._redis.hget(keys.backfill_progress(job_id), "notes")
            fields["notes"] = orjson.dumps([*(orjson.loads(raw) if raw else []), note]).decode()
        await self.move(job_id, status, "queued running paused", **fields)  # a cancelled job stays cancelled
        await self.ended(job_id)

    async def ended(self, job_id: str) -> None:
        """An ended job leaves the active jobs and gives back its place among its project's; it is
        kept ``JOBS_KEPT_S`` from now."""
        async with self._redis.pipeline(transaction=True) as pipe:  # the job's keys: one slot
            pipe.get(keys.backfill(job_id))
            for key in (keys.backfill(job_id), keys.backfill_progress(job_id), keys.backfill_parts(job_id)):
                pipe.expire(key, JOBS_KEPT_S)
            raw, *_ = await pipe.execute()
        await self._redis.srem(keys.BACKFILLS_ACTIVE, job_id)
        if raw:
            await self._redis.zrem(keys.project_backfills(orjson.loads(raw)["projectId"]), job_id)

    async def forget(self, job_id: str) -> None:
        """A job id active without its document (removed by hand): no longer looked at."""
        await self._redis.srem(keys.BACKFILLS_ACTIVE, job_id)

    async def active(self) -> list[str]:
        members = await self._redis.smembers(keys.BACKFILLS_ACTIVE)
        return sorted(_text(m) for m in members)


class JobCap:
    """A job's ``maxJudgeCalls`` as a ``consumers.pair_protocol.CallCap``: the calls its pairs take
    while they are scored (gates-first judges, retries) count in the job's ``judgeCalls``."""

    def __init__(self, parts: JobParts, job_id: str, cap: int | None) -> None:
        self._parts, self._job_id, self._cap = parts, job_id, cap
        self.refused = False  # the cap said no: the job has reached it

    async def take(self, calls: int) -> bool:
        fits = await self._parts.reserve_calls(self._job_id, self._cap, [calls]) == 1
        self.refused = self.refused or not fits
        return fits

    async def give(self, calls: int) -> None:
        await self._parts.give_calls(self._job_id, calls)
