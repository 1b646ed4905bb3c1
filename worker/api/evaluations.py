"""``/v1/datasets`` and ``/v1/evaluations``: dataset runs graded server-side.

The SDK creates a run against a dataset version, runs the user's agent on the rows, and sends
the outputs to ``finalize``; the server grades them here, with the judge endpoint and the keys
this process holds and the same engine ``scorer-worker grade`` uses, and keeps the results.
Datasets and runs belong to the key's project: an operator key must use a project's key.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import Field

from adapters.stores.catalog import CatalogStore
from adapters.stores.claims import Claims
from adapters.stores.client import RedisClient
from adapters.stores.datasets import DatasetStore, parse_rows
from adapters.stores.evaluations import (
    BUDGET_SKIPPED,
    CALLS_BUDGET,
    ROW_FAILED,
    ROW_JUDGED,
    ROW_SKIPPED,
    EvaluationStore,
    calls_left_out_note,
    check_outputs,
    completed,
    kept_calls,
    new_run,
)
from adapters.stores.quotas import ProjectStorage, Quotas
from adapters.stores.review_items import ReviewItems
from adapters.stores.verdicts import VerdictStore
from scorer_groups.api_models import JudgeCallRecord, RowCalls
from scorer_groups.runs import Dataset, DatasetItem, EvaluationCreate, EvaluationRun, Outputs
from scoring.catalog import CatalogSnapshot
from scoring.dataset import DatasetRow, RowResult, grade_rows, human_verdict, plan_grading
from scoring.errors import Conflict, InvalidDocument, NotFound
from scoring.models import ID_PATTERN, Id, Name, ScorerGroup, WireModel
from scoring.results import build_rating, rating_id
from scoring.review_rules import rated_items
from scoring.subjects import as_text
from services.run_spend import RunSpend
from services.unclaimed_verdicts import UnclaimedVerdicts
from worker.api import problems
from worker.api.auth import Who, redis_of
from worker.api.bodies import body_doc, read_body
from worker.api.pages import Cursor, Limit, Number, Page, page
from worker.engine import ScoringEngine
from worker.settings import Settings

router = APIRouter(prefix="/v1", tags=["datasets and evaluations"])
ItemId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]
MAX_CONTENT = 32 * 1024 * 1024
UPLOAD_BODY = 2 * MAX_CONTENT  # a file's text as a JSON string: quotes and newlines escape to two bytes
OUTPUTS_BODY = 32 * 1024 * 1024  # 10,000 rows' outputs


class DatasetUpload(WireModel):
    """Rows as the text of a JSONL or CSV file. CSV: a header row with an `input` column; `expected` is
    optional (an empty cell is no expected answer); a `metadata` column holds a JSON object, and any
    other column becomes a metadata entry of that name."""

    format: Literal["jsonl", "csv"] = "jsonl"
    content: str = Field(max_length=MAX_CONTENT)


class DatasetCreate(DatasetUpload):
    name: Name
    description: str | None = Field(None, max_length=2000)
    id: Id | None = None


class DatasetPage(Page):
    items: list[Dataset]


class DatasetRows(WireModel):
    dataset_id: str
    version: int
    items: list[DatasetItem]


class EvaluationPage(Page):
    items: list[EvaluationRun]


@functools.cache
def _project(who: Who) -> str:
    if who.project_id is None:
        raise InvalidDocument("authorization: datasets and evaluation runs belong to a project; "
                              "use that project's key")
    return who.project_id


def _with_rows(upload: DatasetUpload) -> tuple[DatasetUpload, list[DatasetItem]]:
    """An upload and its parsed rows (in the parser process, for a large one: worker.api.bodies)."""
    return upload, parse_rows(upload.content, upload.format)


def quotas_of(request: Request) -> Quotas:
    settings: Settings = request.app.state.settings
    return Quotas(datasets=settings.max_datasets_per_project, runs=settings.max_evaluation_runs_per_project,
                  stored_bytes=settings.max_project_stored_bytes,
                  alignments=settings.max_alignment_runs_per_project)


def storage_of(request: Request) -> ProjectStorage:
    """The project's quotas, checked and taken in one step (adapters.stores.quotas)."""
    return ProjectStorage(redis_of(request), quotas_of(request))


# A create past a quota: 409, the problem's ``quota`` naming it (adapters.stores.quotas).
QUOTA_REFUSED: dict[int | str, dict[str, Any]] = {
    409: {**problems.RESPONSES[412], "description": "Past a project quota (the problem's `quota` says which)"}}


@router.post("/datasets", status_code=201, response_model=Dataset, responses=QUOTA_REFUSED,
             openapi_extra=body_doc(DatasetCreate, UPLOAD_BODY))
async def create_dataset(who: Who, request: Request, response: Response) -> Dataset:
    project = _project(who)
    storage = storage_of(request)
    await storage.check(project, "dataset")  # before reading the upload
    body, rows = await read_body(request, DatasetCreate, _with_rows)
    async with storage.reserved(project, "dataset", len(body.content.encode())) as reservation:
        dataset = await DatasetStore(redis_of(request)).create(project, body.name, rows, description=body.description,
                                                               dataset_id=body.id, reservation=reservation)
    response.headers["Location"] = str(request.url_for("get_dataset", id=dataset.id).path)
    return dataset


@router.get("/datasets", response_model=DatasetPage)
async def list_datasets(who: Who, request: Request, limit: Limit = 50, cursor: Cursor = None) -> DatasetPage:
    datasets = await DatasetStore(redis_of(request)).list(_project(who))
    items, next_cursor = page(datasets, lambda d: d.id, limit, cursor)
    return DatasetPage(items=items, next_cursor=next_cursor)


@router.get("/datasets/{id}", response_model=Dataset)
async def get_dataset(dataset_id: ItemId, who: Who, request: Request) -> Dataset:
    return await DatasetStore(redis_of(request)).get(_project(who), dataset_id)


@router.post("/datasets/{id}/versions", status_code=201, response_model=Dataset, responses=QUOTA_REFUSED,
             openapi_extra=body_doc(DatasetUpload, UPLOAD_BODY))
async def add_dataset_version(dataset_id: ItemId, who: Who, request: Request) -> Dataset:
    store = DatasetStore(redis_of(request))
    project = _project(who)
    await store.get(project, dataset_id)  # 404 before reading a large upload
    storage = storage_of(request)
    await storage.check(project, "version")
    upload, rows = await read_body(request, DatasetUpload, _with_rows)
    async with storage.reserved(project, "version", len(upload.content.encode())) as reservation:
        return await store.add_version(project, dataset_id, rows, reservation=reservation)


@router.get("/datasets/{id}/rows", response_model=DatasetRows)
async def dataset_rows(dataset_id: ItemId, who: Who, request: Request,
                       version: Annotated[int | None, Query(ge=1, le=1_000_000), Number] = None) -> DatasetRows:
    found, items = await DatasetStore(redis_of(request)).rows(_project(who), dataset_id, version)
    return DatasetRows(dataset_id=dataset_id, version=found, items=items)


@router.post("/evaluations", status_code=201, response_model=EvaluationRun, responses=QUOTA_REFUSED)
async def create_evaluation(body: EvaluationCreate, who: Who, request: Request, response: Response) -> EvaluationRun:
    """The group wins when both ``scorerGroupId`` and ``scorerId`` are sent, and a group-graded
    run nulls ``additionalScorerIds``: the run's ``warnings`` say so."""
    project = _project(who)
    redis = redis_of(request)
    storage = storage_of(request)
    await storage.check(project, "run")
    version, items = await DatasetStore(redis).rows(project, body.dataset_id, body.dataset_version)
    catalog = await CatalogStore(redis).snapshot()
    # NotFound (404) or InvalidDocument (400), answered as their status says.
    plan = plan_grading(catalog, scorer_group_id=body.scorer_group_id, scorer_id=body.scorer_id,
                        additional_scorer_ids=body.additional_scorer_ids or (), project_id=project)
    run = new_run(project, body, version, len(items), plan)
    async with storage.reserved(project, "run", 0) as reservation:
        await EvaluationStore(redis).save(run, reservation=reservation)
    response.headers["Location"] = str(request.url_for("get_evaluation", id=run.id).path)
    return run


@router.get("/evaluations", response_model=EvaluationPage)
async def list_evaluations(who: Who, request: Request, limit: Limit = 50, cursor: Cursor = None) -> EvaluationPage:
    """The project's runs without their rows (read from their summaries); fetch a run for those."""
    items, next_cursor = await EvaluationStore(redis_of(request)).list(_project(who), limit, cursor)
    return EvaluationPage(items=items, next_cursor=next_cursor)


@router.get("/evaluations/{id}", response_model=EvaluationRun)
async def get_evaluation(run_id: ItemId, who: Who, request: Request) -> Response:
    """The run whole - the one read that holds a run (tens of MB at most): sent as it is stored,
    never decoded (``EvaluationStore.save`` stores the wire document, and a run holds no secret
    to mask), within the project's fair share of ``RUN_READS`` at once. Decoded and encoded on
    the event loop, a 33 MB run held it for seconds, and 16 at once answered 500s."""
    project = _project(who)
    async with request.app.state.run_reads.slot(project):
        raw = await EvaluationStore(redis_of(request)).get_raw(project, run_id)
        return Response(raw, media_type="application/json")


@router.get("/evaluations/{id}/rows/{row}/calls", response_model=RowCalls)
async def row_calls(run_id: ItemId, row: Annotated[int, Path(ge=0, le=1_000_000), Number], who: Who,
                    request: Request) -> RowCalls:
    """The judge calls behind one row of a completed run: the exact messages each judge was sent
    and what it answered (cut and masked as a live result's). Reads the run's summary and the
    row, never the run whole."""
    project = _project(who)
    store = EvaluationStore(redis_of(request))
    run = await store.summary(project, run_id)  # 404 for another project's
    if row >= run.row_count:
        raise NotFound(f"run {run_id!r} has {run.row_count} rows (row {row} asked)")
    found = await store.calls(project, run_id, row)
    if found is not None:
        return RowCalls(row=row, calls=[JudgeCallRecord.model_validate(c) for c in found])
    kind = await store.row_kind(project, run_id, row)
    if run.status != "completed":
        note = "the run is not finalized yet"
    elif kind == ROW_FAILED:
        note = "the agent failed on this row: nothing was graded"
    elif kind == ROW_SKIPPED:
        note = f"no judge was called: {BUDGET_SKIPPED}"
    elif kind == ROW_JUDGED:
        note = f"its judge calls are not kept: {CALLS_BUDGET}"
    else:
        note = "no judge graded this row"
    return RowCalls(row=row, calls=[], note=note)


@router.post("/evaluations/{id}/finalize", response_model=EvaluationRun,
             openapi_extra=body_doc(Outputs, OUTPUTS_BODY),
             responses={409: {**problems.RESPONSES[412], "description": "Being finalized by another request"}})
async def finalize_evaluation(run_id: ItemId, who: Who, request: Request) -> EvaluationRun:
    """Grade the agent's outputs (one per row: an ``output``, or the ``error`` the agent raised)
    and keep every row's result; answers the completed run."""
    project = _project(who)
    body: Outputs = await read_body(request, Outputs)
    redis = redis_of(request)
    store = EvaluationStore(redis)
    await store.summary(project, run_id)  # 404 first, without reading a completed run whole
    if not await store.claim_finalize(project, run_id):
        raise Conflict(f"evaluation run {run_id!r} is being finalized by another request")
    try:
        run = await store.get(project, run_id)  # read under the claim: a finished run is not graded again
        check_outputs(run, body.outputs)
        done, calls = await _grade(request, project, run, body)
    finally:
        await store.release_finalize(project, run_id)
    await store.save(done, calls)
    return done


async def _grade(request: Request, project: str, run: EvaluationRun,
                 body: Outputs) -> tuple[EvaluationRun, dict[int, bytes]]:
    """The completed run, and its rows' judge calls as kept with it."""
    redis = redis_of(request)
    _, items = await DatasetStore(redis).rows(project, run.dataset_id, run.dataset_version)
    catalog = await CatalogStore(redis).snapshot()
    try:
        plan = plan_grading(catalog, scorer_group_id=run.scorer_group_id, scorer_id=run.scorer_id,
                            additional_scorer_ids=run.additional_scorer_ids or (), project_id=project)
    except NotFound as exc:  # deleted since the run was created
        raise NotFound(f"what grades this run is gone: {exc}") from None
    rows, failed = [], {}
    for o in body.outputs:
        if o.error is not None or o.output is None:
            failed[o.row] = o.error or "no output"
            continue
        item = items[o.row]
        rows.append(DatasetRow(input=as_text(item.input), output=as_text(o.output), expected=item.expected,
                               spans=[dict(span) for span in o.spans], metadata=dict(item.metadata), id=str(o.row)))
    engine: ScoringEngine = request.app.state.engine  # the process's one engine (judges, sandbox, external)
    policy = engine.panel.verdict_cache
    cache = UnclaimedVerdicts(engine.panel, VerdictStore(redis, policy) if policy is not None and run.cache else None)
    group = plan.group
    found = await cache.look_up(group, catalog, [  # verdicts paid for already reserve nothing
        (str(row.id), rating_id(group.id, f"dataset:{run.id}:{row.id}"), row.subject(group.project_id))
        for row in rows])
    # the project's judge budget, as live pairs spend it
    spend = RunSpend(Claims(redis), run.id, plan, catalog, engine.panel.pricing)
    try:
        granted = await spend.reserve(rows, found)
        graded = await grade_rows(engine.panel, catalog, plan, granted, spends=spend.spends,
                                  verdicts=[found.get(str(row.id)) for row in granted])
        await spend.settle(graded, found)
    finally:
        await spend.close()
    await cache.keep(group.project_id, found.values())
    await _review(redis, catalog, plan.group, run.id, graded.rows)
    skipped = {int(str(row.id)) for row in rows} - {int(str(row.id)) for row in granted}
    humans = [human_verdict(item.human_rating, item.human_pass) for item in items[:run.row_count]]
    online = plan.group.online
    done = completed(run, graded, failed, humans, online.alert_threshold if online is not None else None, skipped)
    calls, left_out = kept_calls(graded)
    if left_out:
        done = done.model_copy(update={"notes": [*done.notes, calls_left_out_note(left_out)]})
    return done, calls


async def _review(redis: RedisClient, catalog: CatalogSnapshot, group: ScorerGroup, run_id: str,
                  graded: list[RowResult]) -> None:
    """The run's rows that the group's review queues with origin ``dataset`` take."""
    queues = catalog.queues_watching(group.id)
    if not queues:
        return
    now = datetime.now(UTC)
    items = [taken for row in graded
             for taken in rated_items(queues, group, "dataset", row.row.subject(group.project_id),
                                      f"dataset:{run_id}:{row.index}",
                                      build_rating(row.result, "dataset", now=now, dataset=(run_id, row.index)))]
    if items:
        await ReviewItems(redis).take(items, now.timestamp())
