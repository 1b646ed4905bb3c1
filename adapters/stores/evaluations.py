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
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import orjson

from adapters.stores import keys
from adapters.stores.client import RedisClient
from scorer_groups.gates import JudgeColumn, breakdown_lines
from scorer_groups.runs import EvaluationCreate, EvaluationRun, JudgeSpendTotals, JudgeSummary, RowOutput
from scoring.calibration import HumanVerdict, MachineColumn, agreement
from scoring.dataset import DatasetRun, GradingPlan
from scoring.errors import InvalidDocument, NotFound


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
        created_at=time.time(), cache=request.cache)


BUDGET_SKIPPED = "the project's judge budget had no room for this row's judge calls: skipped whole"


def completed(run: EvaluationRun, graded: DatasetRun, failed: dict[int, str],
              humans: Sequence[HumanVerdict | None] = (), alert_threshold: float | None = None,
              skipped: Collection[int] = ()) -> EvaluationRun:
    """The run with its results: graded rows from ``graded`` (in the order they were graded),
    the rows in ``failed`` (row -> the agent's error) and in ``skipped`` (no room in the judge
    budget, here or in ``graded.budget_skipped``) as rows without a score; with the dataset's
    human verdicts (``humans``, in row order), its agreement with people."""
    by_row = {r.row.id: (at, r) for at, r in enumerate(graded.rows)}
    no_room = {*skipped, *map(int, graded.budget_skipped)}
    columns = graded.columns()
    rows: list[dict[str, Any]] = []
    ratings: dict[str, list[float | None]] = {j.label: [] for j in columns.judges}
    errors: dict[str, list[str | None]] = {j.label: [] for j in columns.judges}
    for index in range(run.row_count):
        found = by_row.get(str(index))
        if found is None and index in no_room:
            rows.append({"row": index, "rating": None, "reason": f"No score: {BUDGET_SKIPPED}",
                         "judgeScorerResults": [], "scorerRows": [], "skipped": "budget"})
            for j in columns.judges:
                ratings[j.label].append(None)
                errors[j.label].append(BUDGET_SKIPPED)
            continue
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
    budget_skipped = sorted(no_room)
    notes = [*run.notes, *([budget_note(budget_skipped)] if budget_skipped else [])]
    done = run.model_copy(update={
        "status": "completed", "finalized_at": time.time(), "rows": rows, "judges": judges,
        "scored_rows": len(scored), "no_score_rows": len(rows) - len(scored), "budget_skipped_rows": budget_skipped,
        "notes": notes, "spend": JudgeSpendTotals.model_validate(graded.spent())})
    columns_done = done.columns()
    breakdown = breakdown_lines(columns_done.name, columns_done.by_group, columns_done.rating, len(scored),
                                len(rows), [(j.label, j.average) for j in judges])
    rating = columns_done.rating
    machine = [MachineColumn("group", columns_done.name, run.scorer_group_id or run.scorer_id, columns_done.ratings)]
    machine += [MachineColumn("judge", j.label, j.scorer_id, j.ratings) for j in judges]
    agreed = agreement(list(humans) or [None] * len(rows), machine, ids=[None] * len(rows),
                       alert_threshold=alert_threshold)
    return done.model_copy(update={"rating": rating, "breakdown": breakdown, "agreement": agreed})


def budget_note(skipped: Sequence[int]) -> str:
    shown = ", ".join(map(str, skipped[:20])) + (f" and {len(skipped) - 20} more" if len(skipped) > 20 else "")
    return (f"{len(skipped)} row{'s' if len(skipped) != 1 else ''} not graded ({shown}): the project's judge "
            "budget had no room for their judge calls (a row's calls are reserved all or none; see budgetSkippedRows)")


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


# What a row of a completed run is, one character each (``keys.evaluation_rows``): what the
# judge calls of a row without kept calls say of it, read without reading the run.
ROW_FAILED, ROW_SKIPPED, ROW_JUDGED, ROW_UNJUDGED = "e", "b", "j", "-"


def row_kinds(run: EvaluationRun) -> bytes:
    return "".join(ROW_FAILED if r.get("error") is not None else ROW_SKIPPED if r.get("skipped")
                   else ROW_JUDGED if r.get("judgeScorerResults") else ROW_UNJUDGED for r in run.rows).encode()


def listed(run: EvaluationRun) -> EvaluationRun:
    """A run as lists show it: without its rows and judge columns (fetch the run for those)."""
    return run.model_copy(update={"rows": [], "judges": []})


class EvaluationStore:
    """Each run is kept whole (``evaluation``), for ``GET /v1/evaluations/{id}``, and beside it
    what reads of many runs or of one row need, so that they never read a run whole: its
    summary (``listed``) in the project's hash of summaries, its expiry and size in the
    project's hash of sizes (what the quotas count), and one character per row. A run kept
    before these were is read whole once, when first listed or asked for a row, and they are
    written then."""

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis

    async def save(self, run: EvaluationRun, calls: Mapping[int, bytes] | None = None, *,
                   reservation: str | None = None) -> None:
        """The run, and when it was just graded its rows' judge calls (``kept_calls``).
        ``reservation``: its place in the project's quotas, given back in the same transaction."""
        document, kinds = orjson.dumps(run.stored()), row_kinds(run)
        summary = orjson.dumps(listed(run).stored())
        size = len(document) + len(summary) + len(kinds) + sum(len(c) for c in (calls or {}).values())
        project, ttl = run.project_id, keys.EVALUATION_TTL_S
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(keys.evaluation(project, run.id), document, ex=ttl)
            pipe.set(keys.evaluation_rows(project, run.id), kinds, ex=ttl)
            if calls:
                pipe.hset(keys.evaluation_calls(project, run.id), mapping={str(r): c for r, c in calls.items()})
                pipe.expire(keys.evaluation_calls(project, run.id), ttl)
            pipe.hset(keys.evaluation_summaries(project), run.id, summary)
            pipe.hset(keys.evaluation_sizes(project), run.id, _size(time.time() + ttl, size))
            if reservation is not None:
                pipe.hdel(keys.project_storage(project), reservation)
            pipe.zadd(keys.evaluations(project), {run.id: run.created_at})
            for index in (keys.evaluations(project), keys.evaluation_summaries(project),
                          keys.evaluation_sizes(project)):
                pipe.expire(index, ttl)
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
        """The run whole, its rows with it."""
        return EvaluationRun.model_validate(orjson.loads(await self.get_raw(project_id, run_id)))

    async def get_raw(self, project_id: str, run_id: str) -> bytes:
        """The run whole as stored (JSON), for a caller that decodes it where it may."""
        raw = await self.redis.get(keys.evaluation(project_id, run_id))
        if raw is None:
            raise NotFound(f"no evaluation run with id {run_id!r}")
        return raw if isinstance(raw, bytes) else raw.encode()

    async def summary(self, project_id: str, run_id: str) -> EvaluationRun:
        """The run without its rows (``listed``), read without reading the run."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hget(keys.evaluation_summaries(project_id), run_id)
            pipe.hget(keys.evaluation_sizes(project_id), run_id)
            raw, size = await pipe.execute()
        if raw is None or size is None:
            raw = await self._index_kept_before(project_id, run_id)
        elif _expires(size) <= time.time():
            raw = None
        if raw is None:
            raise NotFound(f"no evaluation run with id {run_id!r}")
        return EvaluationRun.model_validate(orjson.loads(raw))

    async def row_kind(self, project_id: str, run_id: str, row: int) -> str:
        """What row ``row`` of the run is (``ROW_FAILED``...; "" before the run is completed)."""
        kind = await self.redis.getrange(keys.evaluation_rows(project_id, run_id), row, row)
        return kind.decode() if isinstance(kind, bytes) else str(kind)

    async def calls(self, project_id: str, run_id: str, row: int) -> builtins.list[dict[str, Any]] | None:
        """A row's judge calls as kept with the run; None when none were (see ``kept_calls``)."""
        raw = await self.redis.hget(keys.evaluation_calls(project_id, run_id), str(row))
        return None if raw is None else list(orjson.loads(raw))

    async def list(self, project_id: str, limit: int, cursor: str | None) -> tuple[builtins.list[EvaluationRun],
                                                                                     str | None]:
        """A page of the project's runs (``worker.api.pages.page``'s contract: by id, after
        ``cursor``), read from their summaries."""
        sizes = await self.sizes(project_id)
        ids = sorted(i for i in sizes if cursor is None or i > cursor)
        chosen = ids[:limit]
        raws = await self.redis.hmget(keys.evaluation_summaries(project_id), chosen) if chosen else []
        runs = [EvaluationRun.model_validate(orjson.loads(raw)) for raw in raws if raw is not None]
        return runs, (chosen[-1] if len(ids) > limit else None)

    async def sizes(self, project_id: str) -> dict[str, int]:
        """The project's runs (those not expired) and the bytes each keeps: what the quotas
        count. Forgets the runs that have expired."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrange(keys.evaluations(project_id), 0, -1)
            pipe.hgetall(keys.evaluation_sizes(project_id))
            members, stored = await pipe.execute()
        stored = {_text(k): _text(v) for k, v in stored.items()}
        for run_id in (_text(m) for m in members):
            if run_id not in stored and await self._index_kept_before(project_id, run_id) is not None:
                stored[run_id] = _text(await self.redis.hget(keys.evaluation_sizes(project_id), run_id) or b"0 0")
        now = time.time()
        gone = [run_id for run_id, size in stored.items() if _expires(size) <= now]
        gone += [run_id for run_id in map(_text, members) if run_id not in stored]
        if gone:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.zrem(keys.evaluations(project_id), *gone)
                pipe.hdel(keys.evaluation_summaries(project_id), *gone)
                pipe.hdel(keys.evaluation_sizes(project_id), *gone)
                await pipe.execute()
        return {run_id: int(size.split()[1]) for run_id, size in stored.items() if run_id not in gone}

    async def _index_kept_before(self, project_id: str, run_id: str) -> bytes | None:
        """A run kept before summaries were: read whole once, its summary, size and row kinds
        written (never over what a save wrote meanwhile). Its summary; None when it has expired."""
        key = keys.evaluation(project_id, run_id)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            pipe.memory_usage(keys.evaluation_calls(project_id, run_id), samples=0)
            raw, ttl_ms, calls_bytes = await pipe.execute()
        if raw is None or ttl_ms is None or ttl_ms < 0:
            return None
        run = EvaluationRun.model_validate(orjson.loads(raw))
        summary, kinds = orjson.dumps(listed(run).stored()), row_kinds(run)
        size = len(raw) + len(summary) + len(kinds) + (calls_bytes or 0)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.hsetnx(keys.evaluation_summaries(project_id), run_id, summary)
            pipe.hsetnx(keys.evaluation_sizes(project_id), run_id, _size(time.time() + ttl_ms / 1000, size))
            pipe.set(keys.evaluation_rows(project_id, run_id), kinds, nx=True, px=ttl_ms)
            pipe.hget(keys.evaluation_summaries(project_id), run_id)
            *_, written = await pipe.execute()
        return bytes(written) if written is not None else summary


def _size(expires_at: float, size: int) -> str:
    """A run's entry in the hash of sizes: when it expires (epoch seconds) and its bytes."""
    return f"{expires_at:.0f} {size}"


def _expires(size: bytes | str) -> float:
    return float(_text(size).split()[0])


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


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
