"""A judge's alignment runs in Redis (issue 56): each run one JSON document, the judge's index of
them by creation time; both kept ``keys.ALIGNMENT_TTL_S`` after their last change."""

from __future__ import annotations

from typing import cast

from scorer_groups.alignments import Alignment
from scoring.stores import keys
from scoring.stores.client import RedisClient

LISTED = 50  # the newest runs a judge's list shows


class AlignmentStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def save(self, run: Alignment) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.alignment(run.judge_id, run.id), run.model_dump_json(by_alias=True), ex=keys.ALIGNMENT_TTL_S)
            pipe.zadd(keys.alignments(run.judge_id), {run.id: run.created_at.timestamp()})
            pipe.expire(keys.alignments(run.judge_id), keys.ALIGNMENT_TTL_S)
            await pipe.execute()

    async def get(self, judge_id: str, alignment_id: str) -> Alignment | None:
        raw = await self._redis.get(keys.alignment(judge_id, alignment_id))
        return None if raw is None else Alignment.model_validate_json(raw)

    async def list(self, judge_id: str) -> list[Alignment]:
        """The judge's newest runs first (those expired leave the index)."""
        ids = cast(list[bytes], await self._redis.zrevrange(keys.alignments(judge_id), 0, LISTED - 1))
        if not ids:
            return []
        raw = await self._redis.mget([keys.alignment(judge_id, i.decode()) for i in ids])
        gone = [i for i, r in zip(ids, raw, strict=True) if r is None]
        if gone:
            await self._redis.zrem(keys.alignments(judge_id), *gone)
        return [Alignment.model_validate_json(r) for r in raw if r is not None]
