"""``/v1/judges/{id}/alignments`` and ``/promote``: a candidate judge measured against the current one, then promoted.

Measured on people's labels it never saw; promoted if it agrees at least as well, or with ``force``. The
one rule: a run is a job, one not ended per project, fleet-wide (another is refused, 429), graded by any
API process (``worker.alignment_runner``). The steps: docs/design-notes.md.
"""

from __future__ import annotations

import statistics
import uuid
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Path, Request, Response

from adapters.stores.alignments import AlignmentStore, AlignmentWork, ledger_token
from adapters.stores.catalog import Write
from adapters.stores.datasets import DatasetStore
from adapters.stores.review_items import ReviewItems
from scorer_groups.alignments import Alignment, AlignmentRequest, Candidate, CaseCounts, PromoteRequest, Shadow
from scoring.alignment import MARK, PROMOTE_MIN_CASES, Case, split
from scoring.catalog import CatalogSnapshot, etag
from scoring.errors import Conflict, InvalidDocument, NotFound
from scoring.models import ID_PATTERN, Judge, ScorerGroup
from scoring.subjects import as_text
from services.groups import Caller, Scorers
from services.review_queues import ReviewQueues
from worker.alignment_runner import AlignmentRunner
from worker.api.auth import Client, Who, redis_of
from worker.api.evaluations import storage_of

log = structlog.get_logger(__name__)

router = APIRouter(prefix="/v1", tags=["judges"])
JudgeId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]
AlignmentId = Annotated[str, Path(alias="alignmentId", max_length=100, pattern=ID_PATTERN)]

AT_ONCE, PER_PROJECT = 4, 1
SAVE_EVERY_S = 2.0
STALE_S = 60.0
LABELLED_READ = 10_000  # a queue's labelled items read for one run (the oldest first)


def runner_of(request: Request) -> AlignmentRunner | None:
    return getattr(request.app.state, "alignments", None)


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
                          response: Response) -> Alignment:
    """Measure a candidate (new criteria, examples or model) against the judge on labels it never
    saw: its own examples are held out, the rest split deterministically, and both judges grade
    the held-out cases within the project's judge budget. Read it back at the Location."""
    judge = await _judge(client, who, judge_id)
    project = _project(judge, who)
    return await _start(judge, project, body, client, who, request, response)


async def _start(judge: Judge, project: str, body: AlignmentRequest, client: Client, who: Caller,
                 request: Request, response: Response) -> Alignment:
    most = request.app.state.settings.judge_max_examples
    if body.candidate.examples is not None and len(body.candidate.examples) > most:
        raise InvalidDocument(f"candidate.examples: at most {most} (SGW_JUDGE_MAX_EXAMPLES)")
    store = AlignmentStore(redis_of(request))
    await store.check_place(project)  # 429 before the labels are read, when a run is not ended
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
    storage = storage_of(request)  # its place in the project's quotas, taken with the count in one step
    work = AlignmentWork(judge=judge, candidate=candidate,
                         cases=[(c.id, c.input, c.output, c.human) for c in evaluated])
    # Pending until its first save, which keeps the entry as long as the run (a process that dies
    # in between holds no place for 90 days).
    size = len(run.model_dump_json(by_alias=True).encode()) + len(work.model_dump_json().encode())
    token = await storage.reserve(project, "alignment", size, token=ledger_token(run.id))
    try:
        # Stored whole first, then its place taken: a runner that finds the place finds the run.
        work_bytes = await store.store_work(run, work)
        if body.shadow_hours is not None:
            run = await _shadow(client, judge, candidate, run, body.shadow_hours)
        await store.save(run, work_bytes)
        await store.begin(run)  # its project's one place among the runs not ended (429 if taken meanwhile)
    except BaseException:
        await store.forget(run.judge_id, run.id)
        await _unshadow(client, run)
        await storage.release(project, token)
        raise
    if (runner := runner_of(request)) is not None:
        runner.wake()
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
