"""Evaluation runs: a dataset version, the subject that answered it, and what grades it.

A run is created against one version of a dataset (recorded, so the run always reads the rows
it was made for); the caller runs its agent on every row and sends the outputs back; the server
grades them with the same engine as ``scorer-worker grade`` (scoring.dataset) and keeps every
row's result, so a failed CI gate can be inspected later (``GET /v1/evaluations/{id}``).

A row the agent failed on (it raised, after the retries it was given) has no output: it is not
graded and counts as a row without a score - a gate fails closed on it like on any other.
"""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from scorer_groups.gates import JudgeColumn, breakdown_lines
from scorer_groups.runs import EvaluationCreate, EvaluationRun, JudgeSummary, RowOutput
from scoring.calibration import HumanVerdict, MachineColumn, agreement
from scoring.dataset import DatasetRun, GradingPlan
from scoring.errors import InvalidDocument, NotFound
from scoring.stores import keys
from scoring.stores.client import RedisClient


def new_run(project_id: str, request: EvaluationCreate, version: int, row_count: int,
            plan: GradingPlan) -> EvaluationRun:
    group_graded = request.scorer_group_id is not None
    return EvaluationRun(
        id=f"run_{uuid.uuid4().hex[:16]}", project_id=project_id, dataset_id=request.dataset_id,
        dataset_version=version, subject=request.subject, scorer_group_id=request.scorer_group_id,
        scorer_id=None if group_graded else request.scorer_id,
        additional_scorer_ids=plan.additional_scorer_ids, status="created", row_count=row_count,
        group_name=plan.group.name if group_graded else None,
        scorer_name=None if group_graded else plan.group.name, warnings=plan.warnings, notes=plan.notes,
        created_at=time.time())


def completed(run: EvaluationRun, graded: DatasetRun, failed: dict[int, str],
              humans: Sequence[HumanVerdict | None] = (), alert_threshold: float | None = None) -> EvaluationRun:
    """The run with its results: graded rows from ``graded`` (in the order they were graded),
    and the rows in ``failed`` (row -> the agent's error) as rows without a score; with the
    dataset's human verdicts (``humans``, in row order), its agreement with people."""
    by_row = {r.row.id: (at, r) for at, r in enumerate(graded.rows)}
    columns = graded.columns()
    rows: list[dict[str, Any]] = []
    ratings: dict[str, list[float | None]] = {j.label: [] for j in columns.judges}
    errors: dict[str, list[str | None]] = {j.label: [] for j in columns.judges}
    for index in range(run.row_count):
        found = by_row.get(str(index))
        if found is None:
            reason = f"No score: the agent failed on this row ({failed.get(index, 'no output')})"
            rows.append({"row": index, "rating": None, "reason": reason, "judgeScorerResults": [],
                         "scorerRows": [], "error": failed.get(index, "no output")})
            for j in columns.judges:
                ratings[j.label].append(None)
                errors[j.label].append("the agent failed on this row")
            continue
        at, result = found
        rows.append({**result.wire(), "row": index, "output": result.row.output})
        for j in columns.judges:
            ratings[j.label].append(j.ratings[at])
            errors[j.label].append(j.errors[at])
    judges = [JudgeSummary(label=j.label, scorer_id=j.ref_id, name=j.name, ratings=ratings[j.label],
                           errors=errors[j.label],
                           average=JudgeColumn(j.label, j.ref_id, j.name, ratings[j.label], []).average)
              for j in columns.judges]
    scored = [r["rating"] for r in rows if r["rating"] is not None]
    done = run.model_copy(update={
        "status": "completed", "finalized_at": time.time(), "rows": rows, "judges": judges,
        "scored_rows": len(scored), "no_score_rows": len(rows) - len(scored)})
    columns_done = done.columns()
    breakdown = breakdown_lines(columns_done.name, columns_done.by_group, columns_done.rating, len(scored),
                                len(rows), [(j.label, j.average) for j in judges])
    rating = columns_done.rating
    machine = [MachineColumn("group", columns_done.name, run.scorer_group_id or run.scorer_id, columns_done.ratings)]
    machine += [MachineColumn("judge", j.label, j.scorer_id, j.ratings) for j in judges]
    agreed = agreement(list(humans) or [None] * len(rows), machine, ids=[None] * len(rows),
                       alert_threshold=alert_threshold)
    return done.model_copy(update={"rating": rating, "breakdown": breakdown, "agreement": agreed})


def kept_calls(graded: DatasetRun, budget: int = keys.EVALUATION_CALLS_BYTES) -> tuple[dict[int, bytes], int]:
    """Per dataset row (the row ids ``completed`` reads), its judge calls as kept with the run -
    the unscored rows first, then the lowest rated, until one does not fit in ``budget`` bytes -
    and how many rows with calls were left out. Rows are encoded in that order and no further:
    the work and the memory are the budget's, whatever the run's size."""
    with_calls = sorted((r for r in graded.rows if r.has_calls), key=lambda r: (r.rating is not None, r.rating or 0.0))
    kept: dict[int, bytes] = {}
    for result in with_calls:
        calls = result.calls()
        if len(calls) > budget:
            break
        budget -= len(calls)
        kept[int(str(result.row.id))] = calls
    return kept, len(with_calls) - len(kept)


CALLS_BUDGET = (f"a run keeps {keys.EVALUATION_CALLS_BYTES // (1024 * 1024)} MiB of judge calls, the unscored and "
                "lowest-rated rows' first")


def calls_left_out_note(left_out: int) -> str:
    return f"the judge calls of {left_out} row{'s' if left_out != 1 else ''} are not kept: {CALLS_BUDGET}"


class EvaluationStore:
    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis

    async def save(self, run: EvaluationRun, calls: Mapping[int, bytes] | None = None) -> None:
        """The run, and when it was just graded its rows' judge calls (``kept_calls``)."""
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.evaluation(run.project_id, run.id), orjson.dumps(run.stored()),
                     ex=keys.EVALUATION_TTL_S)
            if calls:
                pipe.hset(keys.evaluation_calls(run.project_id, run.id), mapping={str(r): c for r, c in calls.items()})
                pipe.expire(keys.evaluation_calls(run.project_id, run.id), keys.EVALUATION_TTL_S)
            pipe.zadd(keys.evaluations(run.project_id), {run.id: run.created_at})
            pipe.expire(keys.evaluations(run.project_id), keys.EVALUATION_TTL_S)
            await pipe.execute()

    async def claim_finalize(self, project_id: str, run_id: str, hold_s: int = 3_600) -> bool:
        """Only one finalize grades a run: a second one at the same time (a retried request, a
        double click) is refused instead of spending the judges twice."""
        claimed = await self.redis.set(keys.evaluation(project_id, run_id) + ":finalizing", b"1",
                                       nx=True, ex=hold_s)
        return bool(claimed)

    async def release_finalize(self, project_id: str, run_id: str) -> None:
        await self.redis.delete(keys.evaluation(project_id, run_id) + ":finalizing")

    async def get(self, project_id: str, run_id: str) -> EvaluationRun:
        raw = await self.redis.get(keys.evaluation(project_id, run_id))
        if raw is None:
            raise NotFound(f"no evaluation run with id {run_id!r}")
        return EvaluationRun.model_validate(orjson.loads(raw))

    async def calls(self, project_id: str, run_id: str, row: int) -> builtins.list[dict[str, Any]] | None:
        """A row's judge calls as kept with the run; None when none were (see ``kept_calls``)."""
        raw = await self.redis.hget(keys.evaluation_calls(project_id, run_id), str(row))
        return None if raw is None else list(orjson.loads(raw))

    async def list(self, project_id: str) -> builtins.list[EvaluationRun]:
        """The project's runs, newest first, without their rows (fetch one run for those)."""
        members = await self.redis.zrevrange(keys.evaluations(project_id), 0, 999)
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in members]
        raws = await self.redis.mget([keys.evaluation(project_id, i) for i in ids]) if ids else []
        runs = []
        for run_id, raw in zip(ids, raws, strict=True):
            if raw is None:  # expired: forget it
                await self.redis.zrem(keys.evaluations(project_id), run_id)
                continue
            run = EvaluationRun.model_validate(orjson.loads(raw))
            runs.append(run.model_copy(update={"rows": [], "judges": []}))
        return runs


def check_outputs(run: EvaluationRun, outputs: list[RowOutput]) -> None:
    """Every row answered once: an output or an error, never both missing."""
    errors = []
    seen: set[int] = set()
    for i, o in enumerate(outputs):
        if o.row >= run.row_count:
            errors.append(f"outputs[{i}].row: the run has {run.row_count} rows (got {o.row})")
        elif o.row in seen:
            errors.append(f"outputs[{i}].row: row {o.row} is answered twice")
        seen.add(o.row)
    missing = sorted(set(range(run.row_count)) - seen)
    if missing:
        errors.append(f"outputs: rows {', '.join(map(str, missing[:20]))} have no output or error")
    if run.status != "created":
        errors.insert(0, "status: the run is already finalized")
    if errors:
        raise InvalidDocument.of(errors)
