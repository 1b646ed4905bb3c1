"""``/v1/judges/{id}/alignments`` and ``/promote`` (issue 56): a candidate judge is measured against
the current one on people's labels it never saw, then - if it agrees at least as well, or with
``force`` - made the judge.

A run, in this process, in the background (``AlignmentTasks``: at most ``PER_PROJECT`` at once per
project and ``AT_ONCE`` in all; the rest are refused, 429):

1. read the labelled cases (a dataset's rows with a humanRating and an output, or a review
   queue's labelled items with texts) and split them (``scoring.alignment.split``);
2. reserve each judge's calls on the held-out cases from the project's judge budget, as a dataset
   run's (``worker.api.run_spend``): a case without room for both is left out, and counted;
3. grade the held-out cases with the current judge and with the candidate - each a one-member
   group on the same engine as the dataset runs - saving the progress every ``SAVE_EVERY_S``;
4. save the figures (``scoring.alignment``). A run whose process died stays "running" in Redis:
   read back, it says ``interrupted`` once it has not been saved for ``STALE_S``.
"""

from __future__ import annotations

import asyncio
import statistics
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Depends, Path, Request, Response

from scorer_groups.alignments import Alignment, AlignmentRequest, Candidate, CaseCounts, PromoteRequest, Shadow
from scoring.alignment import MARK, PROMOTE_MIN_CASES, Case, better, changed, judge_figures, split
from scoring.catalog import CatalogSnapshot, etag
from scoring.dataset import DatasetRow, GradingPlan, grade_rows
from scoring.errors import Conflict, InvalidDocument, NotFound, TooMany
from scoring.groups import Caller, Scorers
from scoring.models import ID_PATTERN, Judge, Member, ScorerGroup
from scoring.review_queues import ReviewQueues
from scoring.stores.alignments import AlignmentStore, ledger_token
from scoring.stores.catalog import CatalogStore, Write
from scoring.stores.claims import Claims
from scoring.stores.datasets import DatasetStore
from scoring.stores.review_items import ReviewItems
from scoring.subjects import as_text
from worker.api.auth import Client, Who, redis_of
from worker.api.evaluations import storage_of
from worker.api.run_spend import RunSpend
from worker.engine import ScoringEngine

log = structlog.get_logger(__name__)

router = APIRouter(prefix="/v1", tags=["judges"])
JudgeId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]
AlignmentId = Annotated[str, Path(alias="alignmentId", max_length=100, pattern=ID_PATTERN)]

AT_ONCE, PER_PROJECT = 4, 1
SAVE_EVERY_S = 2.0
STALE_S = 60.0
LABELLED_READ = 10_000  # a queue's labelled items read for one run (the oldest first)


class AlignmentTasks:
    """The runs this process grades: a task registry with its bounds; ``close`` cancels them."""

    def __init__(self) -> None:
        self._running: dict[asyncio.Future[None], str] = {}  # a run's task (or a slot held for it) -> its project

    @contextmanager
    def admitted(self, project: str) -> Iterator[Callable[[Coroutine[Any, Any, None]], None]]:
        """A slot for one run of ``project``, taken now (before the request's first await: two
        requests at once cannot both take the last one), held by the run spawned in the block,
        given back if none was."""
        per = Counter(self._running.values())
        if len(self._running) >= AT_ONCE or per[project] >= PER_PROJECT:
            raise TooMany(f"an alignment run of project {project!r} is already grading (at most {PER_PROJECT} "
                          f"per project, {AT_ONCE} in all); wait for it")
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._running[slot] = project
        spawned: list[asyncio.Task[None]] = []

        def spawn(coroutine: Coroutine[Any, Any, None]) -> None:
            task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coroutine)
            self._running[task] = project
            task.add_done_callback(lambda t: self._running.pop(t, None))
            spawned.append(task)

        try:
            yield spawn
        finally:
            self._running.pop(slot, None)
            slot.cancel()

    async def close(self) -> None:
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)


def tasks_of(request: Request) -> AlignmentTasks:
    tasks = getattr(request.app.state, "alignment_tasks", None)
    if tasks is None:
        tasks = request.app.state.alignment_tasks = AlignmentTasks()
    return tasks


Tasks = Annotated[AlignmentTasks, Depends(tasks_of)]


def with_candidate(judge: Judge, candidate: Candidate) -> Judge:
    """The judge with what the candidate changes (its criteria, examples, model)."""
    changes = candidate.model_dump(mode="json", by_alias=True, exclude_none=True)
    return Judge.model_validate({**judge.stored(), **changes})


def _now() -> datetime:
    return datetime.now(UTC)


def _theirs(run: Alignment, who: Caller) -> bool:
    """A run is read by its project's keys (and the operators): it quotes that project's labels."""
    return who.operator or run.project_id == who.project_id


def _shown(run: Alignment) -> Alignment:
    if run.state == "running" and (_now() - run.updated_at).total_seconds() > STALE_S:
        return run.model_copy(update={"state": "interrupted"})
    return run


async def _judge(client: Client, who: Caller, judge_id: str) -> Judge:
    """The judge, if the caller may change it (a project its own judges, the operators shared
    ones): measuring, shadowing and promoting a judge are changes of it, and its runs quote the
    labels of the project that ran them."""
    judge = who.writable("judges", await client.store.snapshot(), judge_id, None)
    assert isinstance(judge, Judge)
    return judge


def _project(judge: Judge, who: Caller) -> str:
    """The project a run belongs to, spends from and reads labels of: the judge's."""
    project = judge.project_id or who.project_id
    if project is None:
        raise InvalidDocument("a shared judge is measured by its operators on no project's labels; make it a "
                              "project's judge (or copy it) to measure it on that project's labels")
    return project


async def _cases(request: Request, client: Client, who: Caller, judge: Judge, body: AlignmentRequest
                 ) -> tuple[str, list[Case]]:
    """1: the labelled cases, and where they came from."""
    redis = redis_of(request)
    project = _project(judge, who)
    if body.dataset is not None:
        version, rows = await DatasetStore(redis).rows(project, body.dataset, body.version)
        cases = [Case(f"{body.dataset}:{version}:{n}", as_text(r.input), r.output, r.human_rating)
                 for n, r in enumerate(rows) if r.human_rating is not None and r.output is not None]
        return f"dataset:{body.dataset}:{version}", cases
    assert body.queue is not None
    queue = await ReviewQueues(client.store, who).get(body.queue)  # 404: another project's
    if queue.project_id != project:
        raise InvalidDocument(f"queue: a queue of project {queue.project_id!r} cannot measure a judge of "
                              f"project {project!r}")
    cases = []
    for item, labels in await ReviewItems(redis).labelled_items(queue, LABELLED_READ):
        text = item.subject.transcript or item.subject.input
        if text and labels:
            cases.append(Case(item.id, text, item.subject.output,
                              statistics.median(float(label["rating"]) for label in labels.values())))  # type: ignore[arg-type]
    return f"queue:{queue.id}", cases


@router.post("/judges/{id}/alignments", response_model=Alignment, status_code=202)
async def start_alignment(judge_id: JudgeId, body: AlignmentRequest, client: Client, who: Who, request: Request,
                          response: Response, tasks: Tasks) -> Alignment:
    """Measure a candidate (new criteria, examples or model) against the judge on labels it never
    saw: its own examples are held out, the rest split deterministically, and both judges grade
    the held-out cases within the project's judge budget. Read it back at the Location."""
    judge = await _judge(client, who, judge_id)
    project = _project(judge, who)
    with tasks.admitted(project) as spawn:
        return await _start(judge, project, body, client, who, request, response, spawn)


async def _start(judge: Judge, project: str, body: AlignmentRequest, client: Client, who: Caller,
                 request: Request, response: Response, spawn: Callable[[Coroutine[Any, Any, None]], None]
                 ) -> Alignment:
    most = request.app.state.settings.judge_max_examples
    if body.candidate.examples is not None and len(body.candidate.examples) > most:
        raise InvalidDocument(f"candidate.examples: at most {most} (SGW_JUDGE_MAX_EXAMPLES)")
    source, cases = await _cases(request, client, who, judge, body)
    candidate = with_candidate(judge, body.candidate)
    own, tune, evaluated = split(cases, [*candidate.examples, *judge.examples])  # no judge grades its own
    now = _now()
    run = Alignment(id=f"al_{uuid.uuid4().hex[:12]}", judge_id=judge.id, project_id=project, state="running",
                    total=2 * len(evaluated), source=source, mark=MARK, candidate=body.candidate,
                    judge_etag=etag(judge), created_at=now, updated_at=now,
                    counts=CaseCounts(labelled=len(cases), held_out_as_examples=len(own), tune=len(tune),
                                      evaluated=len(evaluated), budget_skipped=0),
                    tune_case_ids=[c.id for c in tune][:200])
    store = AlignmentStore(redis_of(request))
    storage = storage_of(request)  # its place in the project's quotas, taken with the count in one step
    # Pending until its first save, which keeps the entry as long as the run (a process that dies
    # in between holds no place for 90 days).
    token = await storage.reserve(project, "alignment", len(run.model_dump_json(by_alias=True).encode()),
                                  token=ledger_token(run.id))
    try:
        if body.shadow_hours is not None:
            run = await _shadow(client, judge, candidate, run, body.shadow_hours)
        await store.save(run)
    except BaseException:
        await storage.release(project, token)
        raise
    spawn(_grade(request.app.state.engine, redis_of(request), store, run, judge, candidate, project, evaluated))
    response.headers["Location"] = f"/v1/judges/{judge.id}/alignments/{run.id}"
    return run


MAX_SHADOWED = 5  # live groups one alignment shadows


def _shadow_judge_id(run: Alignment) -> str:
    return f"sh-{run.id[3:]}-judge"


async def _shadow(client: Client, judge: Judge, candidate: Judge, run: Alignment, hours: int) -> Alignment:
    """Shadows: the candidate as a judge of its own, and a copy of each live group of the judge's
    project that has it, the candidate in its place - the same sample (rate and salt), ratings
    only, until ``hours`` from now. One catalog write."""
    until = _now() + timedelta(hours=hours)
    shadow_judge = Judge.model_validate({**candidate.stored(), "id": _shadow_judge_id(run),
                                         "name": f"{judge.name[:180]} (candidate)"})
    made: list[Shadow] = []

    def change(catalog: CatalogSnapshot) -> list[Write]:
        made.clear()
        groups = [g for g in catalog.groups.values()
                  if g.online is not None and g.online.enabled and g.online.shadow_of is None
                  and g.project_id == run.project_id  # the run's project: never another tenant's traffic
                  and any(m.kind == "judge" and m.ref_id == judge.id for m in g.members)]
        if not groups:
            raise InvalidDocument(f"shadowHours: no live group has judge {judge.id!r} to run beside")
        writes: list[Write] = [("judges", shadow_judge.id, shadow_judge)]
        for n, group in enumerate(sorted(groups, key=lambda g: g.id)[:MAX_SHADOWED]):
            assert group.online is not None
            doc: dict[str, Any] = group.stored()
            members: list[dict[str, Any]] = doc["members"]
            doc.update({"id": f"sh-{run.id[3:]}-{n}", "name": f"{group.name[:150]} (shadow, candidate)",
                        "members": [{**m, "refId": shadow_judge.id} if m["kind"] == "judge" and m["refId"] == judge.id
                                    else m for m in members]})
            profile: dict[str, Any] = doc["online"]
            online = {k: v for k, v in profile.items()
                      if k not in ("alertMode", "alertNoScoreRate", "alertMinAgreement")}  # pages no one
            doc["online"] = {**online, "shadowOf": group.id, "shadowUntil": until.isoformat()}
            shadow = ScorerGroup.model_validate(doc)
            writes.append(("groups", shadow.id, shadow))
            made.append(Shadow(group_id=group.id, shadow_id=shadow.id))
        return writes

    await client.store.write(change)
    return run.model_copy(update={"shadows": list(made), "shadow_until": until})


async def _unshadow(client: Client, run: Alignment) -> None:
    """The run's shadows leave the catalog (one write)."""
    if not run.shadows:
        return
    judge_id = _shadow_judge_id(run)

    def change(catalog: CatalogSnapshot) -> list[Write]:
        writes: list[Write] = []
        for shadow in run.shadows:  # only what is still this run's shadow
            doc = catalog.groups.get(shadow.shadow_id)
            if doc is not None and doc.online is not None and doc.online.shadow_of == shadow.group_id \
                    and doc.project_id == run.project_id:
                writes.append(("groups", shadow.shadow_id, None))
        return writes + ([("judges", judge_id, None)] if judge_id in catalog.judges else [])

    await client.store.write(change)


async def _grade(engine: ScoringEngine, redis: object, store: AlignmentStore, run: Alignment, judge: Judge,
                 candidate: Judge, project: str, cases: list[Case]) -> None:
    """2-4, in the background."""
    state = {"run": run}

    async def save(update: dict[str, object]) -> None:
        """The run as stored now (a shadow stopped meanwhile stays stopped), with ``update``."""
        stored = await store.get(run.judge_id, run.id)
        state["run"] = (stored or state["run"]).model_copy(update={**update, "updated_at": _now()})
        await store.save(state["run"])

    try:
        catalog = await CatalogStore(redis).snapshot()  # type: ignore[arg-type]
        candidate_id = f"{judge.id}~candidate"
        catalog = catalog.changed({("judges", judge.id): judge,
                                   ("judges", candidate_id): candidate.model_copy(update={"id": candidate_id})})
        rows = [DatasetRow(input=c.input, output=c.output, id=c.id) for c in cases]
        done = 0

        def progressed(_: int, __: int) -> None:
            nonlocal done
            done += 1

        async def saver() -> None:
            while True:
                await asyncio.sleep(SAVE_EVERY_S)
                await save({"done": done})

        ticking = asyncio.create_task(saver())
        try:
            scores = [await _scores(engine, redis, catalog, f"{run.id}:{name}", ref, project, rows, progressed)
                      for name, ref in (("current", judge.id), ("candidate", candidate_id))]
        finally:
            ticking.cancel()
        skipped = [c.id for c, old, new in zip(cases, *scores, strict=True) if old is None or new is None]
        both = [(c, old, new) for c, old, new in zip(cases, *scores, strict=True) if c.id not in skipped]
        humans = [c.human for c, _, _ in both]
        # The bootstraps are CPU work (400 resamples of up to 1,000 cases): off the API's loop.
        current = await asyncio.to_thread(judge_figures, [old for _, old, _ in both], humans)
        proposed = await asyncio.to_thread(judge_figures, [new for _, _, new in both], humans)
        assert run.counts is not None
        await save({"state": "done", "done": run.total, "current": current, "candidate_figures": proposed,
                    "better": better(current, proposed),
                    "changed": changed([c for c, _, _ in both], [o for _, o, _ in both], [n for _, _, n in both]),
                    "counts": run.counts.model_copy(update={"budget_skipped": len(skipped)}), "finished_at": _now()})
    except asyncio.CancelledError:
        raise  # the process stops: read back later, the run says interrupted
    except Exception as exc:  # a run that fails says so; nothing of it reaches another tenant
        log.exception("an alignment run failed", alignment=run.id, judge=judge.id)
        await save({"state": "failed", "error": f"grading failed ({type(exc).__name__})", "finished_at": _now()})


async def _scores(engine: ScoringEngine, redis: object, catalog: CatalogSnapshot, run_id: str, judge_id: str,
                  project: str, rows: list[DatasetRow], progressed: object) -> list[float | None]:
    """Each row's verdict by one judge (None: no room in the budget, or it could not score)."""
    group = ScorerGroup(id=f"alignment:{run_id}", name="alignment", project_id=project,
                        members=[Member(kind="judge", ref_id=judge_id, weight=1)])
    plan = GradingPlan(group, [])
    spend = RunSpend(Claims(redis), run_id, plan, catalog, engine.panel.pricing)  # type: ignore[arg-type]
    try:
        granted = await spend.reserve(rows)
        graded = await grade_rows(engine.panel, catalog, plan, granted, spends=spend.spends,
                                  progress=progressed)  # type: ignore[arg-type]
        await spend.settle(graded)
    finally:
        await spend.close()
    by_row = {str(r.row.id): r.rating for r in graded.rows}
    return [by_row.get(str(row.id)) for row in rows]


@router.get("/judges/{id}/alignments", response_model=list[Alignment])
async def list_alignments(judge_id: JudgeId, client: Client, who: Who, request: Request) -> list[Alignment]:
    """The judge's alignment runs, the newest first."""
    judge = await _judge(client, who, judge_id)
    return [_shown(r) for r in await AlignmentStore(redis_of(request)).list(judge.id) if _theirs(r, who)]


@router.get("/judges/{id}/alignments/{alignmentId}", response_model=Alignment)
async def get_alignment(judge_id: JudgeId, alignment_id: AlignmentId, client: Client, who: Who,
                        request: Request) -> Alignment:
    judge = await _judge(client, who, judge_id)
    run = await AlignmentStore(redis_of(request)).get(judge.id, alignment_id)
    if run is None or not _theirs(run, who):
        raise NotFound(f"judge {judge.id!r} has no alignment run {alignment_id!r}")
    return _shown(run)


@router.delete("/judges/{id}/alignments/{alignmentId}/shadow", status_code=204, response_class=Response)
async def stop_shadow(judge_id: JudgeId, alignment_id: AlignmentId, client: Client, who: Who,
                      request: Request) -> Response:
    """Stop running the candidate on live traffic: its shadow groups leave the catalog."""
    judge = await _judge(client, who, judge_id)
    store = AlignmentStore(redis_of(request))
    run = await store.get(judge.id, alignment_id)
    if run is None or not _theirs(run, who):
        raise NotFound(f"judge {judge.id!r} has no alignment run {alignment_id!r}")
    await _unshadow(client, run)
    await store.save(run.model_copy(update={"shadows": [], "updated_at": _now()}))
    return Response(status_code=204)


@router.post("/judges/{id}/promote", response_model=Judge)
async def promote(judge_id: JudgeId, body: PromoteRequest, client: Client, who: Who, request: Request,
                  response: Response) -> Judge:
    """Make an alignment run's candidate the judge: a new revision (backfills grade again), the
    run keeping who promoted it and when. Refused (409) when the run is not done, when the judge
    changed since it ran, when fewer than ``PROMOTE_MIN_CASES`` held-out cases compared the two, or
    when the candidate agreed worse on them - unless ``force``."""
    judge = await _judge(client, who, judge_id)
    store = AlignmentStore(redis_of(request))
    run = await store.get(judge.id, body.alignment)
    if run is None or not _theirs(run, who):
        raise NotFound(f"judge {judge.id!r} has no alignment run {body.alignment!r}")
    if run.state != "done":
        raise Conflict(f"alignment {run.id!r} is {_shown(run).state}, not done: nothing to promote yet")
    if run.promoted_at is not None:
        raise Conflict(f"alignment {run.id!r} was promoted already")
    if etag(judge) != run.judge_etag:
        raise Conflict(f"judge {judge.id!r} changed since alignment {run.id!r} ran: run it again")
    graded = run.current.cases if run.current is not None else 0
    if graded < PROMOTE_MIN_CASES and not body.force:
        raise Conflict(f"the judges were compared on {graded} held-out case(s); at least {PROMOTE_MIN_CASES} decide "
                       "a promotion (label more, or send force: true to promote it anyway)")
    if not run.better and not body.force:
        cases = run.counts.evaluated if run.counts else 0
        raise Conflict(f"the candidate agreed worse with people than the judge on the {cases} held-out cases (see "
                       "the run's figures); send force: true to promote it anyway")
    promoted = with_candidate(judge, run.candidate)
    saved = await Scorers(client.store, who).put(promoted, if_match=run.judge_etag)
    await _unshadow(client, run)
    await store.save(run.model_copy(update={"promoted_at": _now(), "promoted_by": who.actor, "updated_at": _now(),
                                            "shadows": []}))
    assert isinstance(saved, Judge)
    response.headers["ETag"] = etag(saved)
    return saved
