"""Backfill jobs in Redis (issue 42): each job's document, and the indexes a worker and the API
read - a group's jobs, newest first, and the jobs not ended yet.

Step 1 of the issue: the jobs and their API. The runner that reads a job's range of the traces
topic (offsets-for-times per partition, partitions leased per worker) is the next step; until it
lands, this module is on a branch only.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime

import orjson

from scorer_groups.api_models import BACKFILL_ENDED, BackfillCreate, BackfillJob
from scoring.errors import Conflict, NotFound
from scoring.stores import keys
from scoring.stores.client import RedisClient

JOBS_KEPT_S = 30 * 86_400  # an ended job is kept for a month: its progress stays readable


class BackfillStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

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
        """The job; another project's is as if it did not exist (404)."""
        raw = await self._redis.get(keys.backfill(job_id))
        job = BackfillJob.model_validate(orjson.loads(raw)) if raw else None
        if job is None or (project_id is not None and job.project_id != project_id):
            raise NotFound(f"no backfill with id {job_id!r}")
        return job

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
