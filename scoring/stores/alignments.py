"""A judge's alignment runs in Redis (issue 56): each run one JSON document, the judge's index of
them by creation time; both kept ``keys.ALIGNMENT_TTL_S`` after their last change, and counted in
the project's storage ledger for as long (``scoring.stores.quotas``: the API reserves a run's place
before its first save)."""

from __future__ import annotations

from typing import cast

from scorer_groups.alignments import Alignment
from scoring.stores import keys
from scoring.stores.client import RedisClient
from scoring.stores.quotas import LEDGER_TTL_S, ledger_entry

LISTED = 50  # the newest runs a judge's list shows


def ledger_token(alignment_id: str) -> str:
    """A run's entry in its project's storage ledger."""
    return f"alignment:{alignment_id}"


class AlignmentStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def save(self, run: Alignment) -> None:
        document = run.model_dump_json(by_alias=True).encode()  # bytes: what Redis keeps
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.alignment(run.judge_id, run.id), document, ex=keys.ALIGNMENT_TTL_S)
            if run.project_id is not None:  # every run has one (the judge's); the model allows none
                pipe.hset(keys.project_storage(run.project_id), ledger_token(run.id),
                          ledger_entry("alignment", keys.ALIGNMENT_TTL_S, len(document)))
                pipe.expire(keys.project_storage(run.project_id), LEDGER_TTL_S)
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
