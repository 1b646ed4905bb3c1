"""Backfill jobs in Redis (issue 42): each job's document, and the indexes a worker and the API
read - a group's jobs, newest first, and the jobs not ended yet.

The runner (``consumers.backfill``) plans a job's ranges, leases its partitions and records
the offsets they reached and the job's counts here (``JobParts``).
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import orjson

from scorer_groups.api_models import BACKFILL_ENDED, BackfillCreate, BackfillJob, BackfillProgress
from scoring.errors import Conflict, InvalidDocument, NotFound
from scoring.models import ScorerGroup
from scoring.stores import keys
from scoring.stores.client import RedisClient

JOBS_KEPT_S = 30 * 86_400  # an ended job is kept for a month: its progress stays readable


def backfill_sample(group: ScorerGroup, request: BackfillCreate, now: datetime | None = None) -> float:
    """The job's sample rate, once the request is known to fit the group; else InvalidDocument
    naming every field refused (the API's 400, the CLI's error line)."""
    refused = []
    if group.online is not None and group.online.scope == "session":
        refused.append("scope: a session-scope group cannot be backfilled: a conversation's turns are spread over "
                       "partitions read by different workers at different times, and a window cuts conversations "
                       "in two (see the README, Backfills)")
    if request.to > (now or datetime.now(UTC)):
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

    async def start(self, group: ScorerGroup, request: BackfillCreate) -> BackfillJob:
        """Check the request against the group (``backfill_sample``) and queue the job."""
        return await self.create(group.id, group.project_id, request, backfill_sample(group, request))

    async def create(self, group_id: str, project_id: str, request: BackfillCreate, sample_rate: float) -> BackfillJob:
        now = datetime.now(UTC)
        job = BackfillJob(id=f"bf-{uuid.uuid4().hex[:16]}", group_id=group_id, project_id=project_id,
                          status="queued", from_=request.from_, to=request.to, sample_rate=sample_rate,
                          max_judge_calls=request.max_judge_calls, alerts=request.alerts, created_at=now,
                          updated_at=now)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.backfill(job.id), orjson.dumps(job.model_dump(mode="json", by_alias=True)))
            pipe.zadd(keys.group_backfills(group_id), {job.id: time.time()})
            pipe.sadd(keys.BACKFILLS_ACTIVE, job.id)
            await pipe.execute()
        return job

    async def get(self, job_id: str, project_id: str | None = None) -> BackfillJob:
        """The job with its progress; another project's is as if it did not exist (404)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(keys.backfill(job_id))
            pipe.hgetall(keys.backfill_progress(job_id))
            pipe.hgetall(keys.backfill_parts(job_id))
            raw, counts, parts = await pipe.execute()
        job = BackfillJob.model_validate(orjson.loads(raw)) if raw else None
        if job is None or (project_id is not None and job.project_id != project_id):
            raise NotFound(f"no backfill with id {job_id!r}")
        counts = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in counts.items()}
        ranges = [orjson.loads(v) for v in parts.values()]
        total = sum(r["end"] - r["start"] for r in ranges)
        read = sum(r["next"] - r["start"] for r in ranges)
        fraction = 1.0 if job.status == "done" else (read / total if total else 0.0)
        return job.model_copy(update={"progress": BackfillProgress(
            fraction=round(fraction, 4), traces_read=counts.get("tracesRead", 0),
            pairs_scored=counts.get("pairsScored", 0), pairs_skipped=counts.get("pairsSkipped", 0),
            judge_calls=counts.get("judgeCalls", 0))})

    async def of_group(self, group_id: str, limit: int = 50) -> list[BackfillJob]:
        found = await self._redis.zrevrange(keys.group_backfills(group_id), 0, limit - 1)
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in found]
        raws = await self._redis.mget([keys.backfill(i) for i in ids]) if ids else []
        return [BackfillJob.model_validate(orjson.loads(r)) for r in raws if r]

    async def cancel(self, job_id: str, project_id: str | None = None) -> BackfillJob:
        job = await self.get(job_id, project_id)
        if job.status in BACKFILL_ENDED:
            raise Conflict(f"backfill {job_id!r} has already ended ({job.status})")
        cancelled = job.model_copy(update={"status": "cancelled", "updated_at": datetime.now(UTC)})
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.backfill(job_id), orjson.dumps(cancelled.model_dump(mode="json", by_alias=True)),
                     ex=JOBS_KEPT_S)
            pipe.srem(keys.BACKFILLS_ACTIVE, job_id)
            await pipe.execute()
        return cancelled


# --- What the runners share through Redis ------------------------------------------------------

PLAN_LOCK_S = 60  # one worker plans a job's ranges; another may try again after this
PART_LEASE_S = 30  # a worker holds a partition of a job this long without renewing it


class JobParts:
    """A job's ranges per partition, the offset each has reached, and who reads each."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def try_plan(self, job_id: str, worker: str) -> bool:
        return bool(await self._redis.set(keys.backfill_plan_lock(job_id), worker, nx=True, ex=PLAN_LOCK_S))

    async def save_plan(self, job_id: str, ranges: dict[int, tuple[int, int]], notes: list[str]) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            for partition, (start, end) in ranges.items():
                pipe.hset(keys.backfill_parts(job_id), str(partition), orjson.dumps({"start": start, "end": end,
                                                                                     "next": start}))
            pipe.expire(keys.backfill_parts(job_id), JOBS_KEPT_S)
            await pipe.execute()
        await self._update(job_id, status="running", notes=notes)

    async def parts(self, job_id: str) -> dict[int, dict[str, int]]:
        raw = await self._redis.hgetall(keys.backfill_parts(job_id))
        return {int(k): orjson.loads(v) for k, v in raw.items()}

    async def lease(self, job_id: str, partition: int, worker: str) -> bool:
        """Take (or renew) the partition for ``worker``: one reader per partition of a job."""
        key = keys.backfill_lease(job_id, partition)
        if await self._redis.set(key, worker, nx=True, ex=PART_LEASE_S):
            return True
        held = await self._redis.get(key)
        if held is not None and (held.decode() if isinstance(held, bytes) else held) == worker:
            await self._redis.expire(key, PART_LEASE_S)
            return True
        return False

    async def advance(self, job_id: str, partition: int, next_offset: int, **progress: int) -> None:
        """The partition's reached offset, after its batch's pairs are done; and the job's counts."""
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
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}

    async def _update(self, job_id: str, **fields: object) -> None:
        raw = await self._redis.get(keys.backfill(job_id))
        if raw is None:
            return
        doc = orjson.loads(raw)
        doc.update({k: v for k, v in fields.items() if k != "notes"})
        if fields.get("notes"):
            doc["notes"] = [*doc.get("notes", []), *fields["notes"]]  # type: ignore[misc]
        doc["updatedAt"] = datetime.now(UTC).isoformat()
        await self._redis.set(keys.backfill(job_id), orjson.dumps(doc))

    async def finish(self, job_id: str, status: str = "done", error: str | None = None) -> None:
        await self._update(job_id, status=status, error=error)
        await self._redis.srem(keys.BACKFILLS_ACTIVE, job_id)

    async def active(self) -> list[str]:
        members = await self._redis.smembers(keys.BACKFILLS_ACTIVE)
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
