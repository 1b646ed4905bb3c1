"""``scorer-worker grade``: grade a dataset run (JSONL) with a scorer group, for people and CI.

Writes one JSON line per row (to ``--output`` or stdout), prints the summary to stderr, and
exits 1 when the ``--fail-under`` gate fails, 2 on bad input, 0 otherwise. The gate fails closed:
a row without a score (a must-pass member could not score it, or the judge budget had no room
for it) fails it, unless ``--allow-unscored`` lets that many rows (a count, or a fraction of the
rows) pass. ``--publish`` also sends each row's result to the ratings topic with scope ``dataset``.

Its judge calls are reserved from the group's project's judge budget as the API's dataset runs'
are (``services.run_spend``): a row without room is not graded, and the summary names it.
``--outside-budget`` is the operator's explicit way around it, and the summary says so.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import IO, Any, TextIO

import orjson

from adapters.stores.catalog import CatalogStore
from adapters.stores.claims import Claims
from adapters.stores.verdicts import VerdictStore
from scorer_groups.gates import Allowance, GateFailed, NotAJudgeMember
from scoring.dataset import (
    DatasetRow,
    DatasetRun,
    GradingPlan,
    RowResult,
    grade_rows,
    plan_grading,
    requires_expected_judges,
)
from scoring.errors import CatalogError
from scoring.results import build_rating, rating_id
from scoring.verdict_cache import PairVerdicts
from services.run_spend import RunSpend
from services.unclaimed_verdicts import UnclaimedVerdicts
from worker.connections import kafka_producer, redis_client
from worker.engine import ScoringEngine
from worker.settings import Settings

PROGRESS_AFTER_S = 2.0  # a bar for runs longer than this; short runs print nothing until the end


@dataclass(frozen=True)
class GradeOptions:
    input_path: str
    group_id: str | None
    scorer_id: str | None = None
    additional_scorer_ids: tuple[str, ...] = ()
    output_path: str | None = None
    fail_under: float | None = None
    gate_scorer: str | None = None
    concurrency: int = 8
    publish: bool = False
    allow_unscored: Allowance = 0  # rows without a score the gate lets pass (count or fraction)
    with_calls: bool = False  # each row's line carries its judge calls (scoring.judge_calls: cut and masked)
    cache: bool = True  # the verdict cache read and kept (--no-cache: every judge asked afresh)
    outside_budget: bool = False  # --outside-budget: nothing reserved from the project's judge budget


def read_rows(path: str) -> list[DatasetRow]:
    rows: list[DatasetRow] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f):
            if line.strip():
                try:
                    document = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise ValueError(f"line {number + 1}: not JSON ({exc})") from None
                rows.append(DatasetRow.from_json(document, len(rows)))
    return rows


class Progress:
    """A bar on a terminal once a run takes more than a moment; plain lines elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._started = time.monotonic()
        self._last_line = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        elapsed = now - self._started
        if elapsed < PROGRESS_AFTER_S and done < total:
            return
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else 0.0
        if self._tty:
            filled = int(30 * done / total)
            self._stream.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} rows "
                               f"{rate:.1f}/s eta {eta:.0f}s")
            self._drawn = True
            if done == total:
                self._stream.write("\n")
        elif now - self._last_line >= 5 or done == total:
            self._stream.write(f"graded {done}/{total} rows ({rate:.1f}/s)\n")
            self._last_line = now
        self._stream.flush()


async def grade(settings: Settings, request: GradeOptions, out: IO[str], err: TextIO) -> int:
    try:
        rows = read_rows(request.input_path)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=err)
        return 2
    redis = redis_client(settings)
    try:
        catalog = await CatalogStore(redis).snapshot()
    finally:
        await redis.aclose()
    try:
        plan = plan_grading(catalog, scorer_group_id=request.group_id, scorer_id=request.scorer_id,
                            additional_scorer_ids=request.additional_scorer_ids)
    except CatalogError as exc:
        print(f"error: {exc}", file=err)
        return 2
    for warning in plan.warnings:
        print(f"warning: {warning}", file=err)
    for note in plan.notes:
        print(f"note: {note}", file=err)
    without_expected = sum(1 for r in rows if r.expected is None)
    for judge in requires_expected_judges(plan.group, catalog):
        if without_expected:
            print(f"warning: judge {judge.name!r} requires an expected answer; {without_expected} "
                  "row(s) have none and it cannot score them", file=err)

    run_id = str(uuid.uuid4())  # names its rows' ratings: what a verdict they paid for says paid for it
    run = await _grade(settings, catalog, plan, rows, request, err, run_id)
    for row in run.rows:
        document = row.wire()
        if request.with_calls:
            document["judgeCalls"] = orjson.loads(row.calls() or b"[]")
        out.write(json.dumps(document) + "\n")
    out.flush()
    summary = {**run.summary(), "judgeBudget": "outside (--outside-budget)" if request.outside_budget else
               f"project {plan.group.project_id}"}
    if run.budget_skipped:
        summary["budgetSkippedRows"] = [int(i) for i in run.budget_skipped]
    print(json.dumps(summary, indent=2), file=err)
    if run.budget_skipped:
        print(f"warning: {len(run.budget_skipped)} of {len(rows)} rows were not graded: the judge budget of project "
              f"{plan.group.project_id!r} had no room for their calls", file=err)
    agreement = run.agreement
    for line in agreement.lines() if agreement is not None else []:
        print(line, file=err)
    if request.publish:
        await _publish(settings, run, run_id)
        print(f"published {len(run.rows)} results to {settings.ratings_topic}", file=err)
    if request.fail_under is not None:
        allowed = request.allow_unscored if isinstance(request.allow_unscored, int) else \
            math.floor(request.allow_unscored * len(rows) + 1e-9)
        if len(run.budget_skipped) > allowed:  # fail closed: a row never graded has no score
            print(f"gate failed: {len(run.budget_skipped)} of {len(rows)} rows have no score (the judge budget had "
                  f"no room) and {allowed} may (--allow-unscored)", file=err)
            return 1
        try:  # one allowance for both: what the rows never graded took of it is not given again
            value = run.gate(request.fail_under, scorer=request.gate_scorer,
                             allow_unscored=allowed - len(run.budget_skipped))
        except NotAJudgeMember as exc:  # the gate's configuration, not the run's quality
            print(f"error: {exc}", file=err)
            return 2
        except GateFailed as exc:
            print(str(exc), file=err)
            return 1
        print(f"gate passed: {value:.2f} >= {request.fail_under:g}", file=err)
    return 0


async def _grade(settings: Settings, catalog: Any, plan: GradingPlan, rows: list[DatasetRow],
                 request: GradeOptions, err: TextIO, run_id: str) -> DatasetRun:
    """Grade rows with the judge endpoint, external scorers and code sandbox ``settings`` name;
    the verdicts already paid for (the verdict cache) are read first and those paid for now kept."""
    redis = redis_client(settings)
    try:
        async with ScoringEngine(settings) as engine:
            cache = UnclaimedVerdicts(engine.panel, VerdictStore(redis, engine.panel.verdict_cache)
                                      if request.cache and engine.panel.verdict_cache is not None else None)
            group = plan.group
            found = await cache.look_up(group, catalog, [  # by row index: a row's id is optional
                (str(index), rating_id(group.id, f"dataset:{run_id}:{index}"), row.subject(group.project_id))
                for index, row in enumerate(rows)])
            if request.outside_budget:
                run = await grade_rows(engine.panel, catalog, plan, rows, concurrency=request.concurrency,
                                       progress=Progress(err), verdicts=[found.get(str(i)) for i in range(len(rows))])
            else:
                run = await _budgeted(engine, Claims(redis), catalog, plan, rows, request, err, run_id, found)
            await cache.keep(group.project_id, found.values())
            return run
    finally:
        await redis.aclose()


async def _budgeted(engine: ScoringEngine, claims: Claims, catalog: Any, plan: GradingPlan, rows: list[DatasetRow],
                    request: GradeOptions, err: TextIO, run_id: str, found: Mapping[str, PairVerdicts]
                    ) -> DatasetRun:
    """The rows graded within the project's judge budget: each row's calls reserved before it
    is graded, all or none, as a dataset run of the API's; the others named skipped. Rows are
    keyed by their place in the file (their own ids need not be unique)."""
    by_place = [dataclasses.replace(row, id=str(i)) for i, row in enumerate(rows)]
    spend = RunSpend(claims, run_id, plan, catalog, engine.panel.pricing)
    try:
        granted = await spend.reserve(by_place, found)
        graded = await grade_rows(engine.panel, catalog, plan, granted, concurrency=request.concurrency,
                                  progress=Progress(err), spends=spend.spends,
                                  verdicts=[found.get(str(row.id)) for row in granted])
        await spend.settle(graded, found)
    finally:
        await spend.close()
    kept = {str(r.row.id) for r in graded.rows}
    return dataclasses.replace(
        graded, rows=[RowResult(int(str(r.row.id)), rows[int(str(r.row.id))], r.result) for r in graded.rows],
        budget_skipped=[str(i) for i in range(len(rows)) if str(i) not in kept])


async def _publish(settings: Settings, run: DatasetRun, run_id: str) -> None:
    now = datetime.now(UTC)
    producer = kafka_producer(settings)
    await producer.start()
    try:
        acks = []
        for row in run.rows:
            rating = build_rating(row.result, "dataset", now=now, dataset=(run_id, row.index))
            acks.append(await producer.send(settings.ratings_topic, key=run_id.encode(),
                                            value=rating.to_json()))
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


def write_to(path: str | None) -> IO[str]:
    return open(path, "w", encoding="utf-8") if path else sys.stdout

