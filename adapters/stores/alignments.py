"""A judge's alignment runs in Redis: each run one JSON document, the judge's index of
them by creation time; both kept ``keys.ALIGNMENT_TTL_S`` after their last change, and counted in
the project's storage ledger for as long (``adapters.stores.quotas``: the API reserves a run's place
before its first save).

A run not ended is a job (``worker.alignment_runner`` grades it): its work (the judges as they
were, the cases), the verdicts it has so far, its place among the runs not ended (one per project,
taken in one script), and the lease of the process grading it.
"""

from __future__ import annotations

from typing import cast

from pydantic import BaseModel

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.quotas import LEDGER_TTL_S, ledger_entry
from adapters.stores.scripts import LEASE
from scorer_groups.alignments import Alignment
from scoring.alignment import Case
from scoring.errors import TooMany
from scoring.models import Judge

LISTED = 50  # the newest runs a judge's list shows


def ledger_token(alignment_id: str) -> str:
    """A run's entry in its project's storage ledger."""
    return f"alignment:{alignment_id}"


ACTIVE_PER_PROJECT = 1  # a project's runs not ended, fleet-wide: each grades on its judge budget

# KEYS: the runs not ended. ARGV: the run, "<project> <judge>", the most per project, "take" or
# "check". 1 when the run took its place (or, to check, would); 0 when its project has the most.
_BEGIN = """
local project = string.match(ARGV[2], '^(%S+)')
local held = 0
local entries = redis.call('HGETALL', KEYS[1])
for i = 2, #entries, 2 do
  if string.match(entries[i], '^(%S+)') == project then held = held + 1 end
end
if held >= tonumber(ARGV[3]) then return 0 end
if ARGV[4] == 'take' then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return 1
"""



def _busy(project_id: str) -> TooMany:
    return TooMany(f"an alignment run of project {project_id!r} is already grading (at most "
                   f"{ACTIVE_PER_PROJECT} per project); wait for it")


class AlignmentWork(BaseModel):
    """What a run grades, as it began: the judge and the candidate, the held-out cases."""

    judge: Judge
    candidate: Judge
    cases: list[tuple[str, str, str, float]]  # id, input, output, people's rating

    def case_list(self) -> list[Case]:
        return [Case(*c) for c in self.cases]


class AlignmentStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._begin = redis.register_script(_BEGIN)
        self._lease = redis.register_script(LEASE)

    async def check_place(self, project_id: str) -> None:
        """``TooMany`` when the project has a run not ended - before a start reads its labels."""
        if not await self._begin([keys.ALIGNMENTS_ACTIVE], ["-", f"{project_id} -", ACTIVE_PER_PROJECT, "check"]):
            raise _busy(project_id)

    async def store_work(self, run: Alignment, work: AlignmentWork) -> int:
        """The run's work, stored before the run takes its place (a runner that finds a place
        finds its work); its bytes, for the ledger (``save``)."""
        document = work.model_dump_json().encode()
        await self._redis.set(keys.alignment_work(run.judge_id, run.id), document, ex=keys.ALIGNMENT_TTL_S)
        return len(document)

    async def begin(self, run: Alignment) -> None:
        """The run, stored with its work, takes its place among the runs not ended: ``TooMany``
        when its project has one (checked and taken in one script)."""
        assert run.project_id is not None
        if not await self._begin([keys.ALIGNMENTS_ACTIVE], [run.id, f"{run.project_id} {run.judge_id}",
                                                            ACTIVE_PER_PROJECT, "take"]):
            raise _busy(run.project_id)

    async def forget(self, judge_id: str, alignment_id: str) -> None:
        """A run that never began (refused its place): its document, work and index entry."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.alignment(judge_id, alignment_id), keys.alignment_work(judge_id, alignment_id))
            pipe.zrem(keys.alignments(judge_id), alignment_id)
            await pipe.execute()

    async def active(self) -> dict[str, str]:
        """The runs not ended: run id -> judge id."""
        entries = cast(dict[bytes, bytes], await self._redis.hgetall(keys.ALIGNMENTS_ACTIVE))
        return {k.decode(): v.decode().split(" ", 1)[1] for k, v in entries.items()}

    async def work(self, judge_id: str, alignment_id: str) -> tuple[AlignmentWork, int] | None:
        """The run's work and its bytes; None once it ended."""
        raw = await self._redis.get(keys.alignment_work(judge_id, alignment_id))
        return None if raw is None else (AlignmentWork.model_validate_json(raw), len(raw))

    async def verdicts(self, judge_id: str, alignment_id: str) -> dict[str, float | None]:
        """The verdicts the run has: "<role>:<case id>" -> rating (None: it could not score)."""
        raw = cast(dict[bytes, bytes], await self._redis.hgetall(keys.alignment_verdicts(judge_id, alignment_id)))
        return {k.decode(): float(v) if v else None for k, v in raw.items()}

    async def add_verdicts(self, run: Alignment, verdicts: dict[str, float | None]) -> None:
        key = keys.alignment_verdicts(run.judge_id, run.id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={k: "" if v is None else repr(v) for k, v in verdicts.items()})
            pipe.expire(key, keys.ALIGNMENT_TTL_S)
            await pipe.execute()

    async def lease(self, judge_id: str, alignment_id: str, owner: str) -> bool:
        """Take or renew the run's lease for ``owner``: False when another process holds it."""
        return bool(await self._lease([keys.alignment_lease(judge_id, alignment_id)],
                                      [owner, keys.ALIGNMENT_LEASE_MS]))

    async def end(self, judge_id: str, alignment_id: str) -> None:
        """The run ended (or is gone): its work, verdicts and lease leave, and so does its place."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(keys.alignment_work(judge_id, alignment_id), keys.alignment_verdicts(judge_id, alignment_id),
                        keys.alignment_lease(judge_id, alignment_id))
            await pipe.execute()
        await self._redis.hdel(keys.ALIGNMENTS_ACTIVE, alignment_id)

    async def save(self, run: Alignment, work_bytes: int = 0) -> None:
        """The run's document; the ledger counts it and ``work_bytes`` (its work, while it runs)."""
        document = run.model_dump_json(by_alias=True).encode()  # bytes: what Redis keeps
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.alignment(run.judge_id, run.id), document, ex=keys.ALIGNMENT_TTL_S)
            if run.project_id is not None:  # every run has one (the judge's); the model allows none
                pipe.hset(keys.project_storage(run.project_id), ledger_token(run.id),
                          ledger_entry("alignment", keys.ALIGNMENT_TTL_S, len(document) + work_bytes))
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
