"""Alignment runs as jobs: every API process grades the runs not ended that no other process holds.

So a run outlives the process that started it (``adapters.stores.alignments``). The one rule: nothing
stored is paid twice - a process that dies repeats at most the chunk it was grading, and whoever resumes
starts where the stored verdicts end. The steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime

import structlog

from adapters.stores import keys
from adapters.stores.alignments import AlignmentStore, AlignmentWork
from adapters.stores.catalog import CatalogStore
from adapters.stores.claims import Claims
from adapters.stores.client import RedisClient
from consumers.outage import not_the_subjects_fault
from scorer_groups.alignments import Alignment
from scoring.alignment import Case, better, changed, judge_figures
from scoring.catalog import CatalogSnapshot
from scoring.dataset import DatasetRow, GradingPlan, grade_rows
from scoring.models import Member, ScorerGroup
from services.run_spend import RunSpend
from worker.engine import ScoringEngine

log = structlog.get_logger(__name__)

POLL_S = 1.0
AT_ONCE = 4  # runs this process grades at once
CHUNK = 25  # cases reserved, graded and stored together: what a process that dies repeats, at most
SAVE_EVERY_S = 2.0
ROLES = ("current", "candidate")


class LeaseLost(Exception):
    """Another process took the run (this one stalled past its lease): it stops here."""


class AlignmentRunner:
    def __init__(self, engine: ScoringEngine, redis: RedisClient) -> None:
        self._engine, self._redis = engine, redis
        self._store = AlignmentStore(redis)
        self._owner = f"api:{uuid.uuid4().hex[:12]}"
        self._grading: dict[str, asyncio.Task[None]] = {}  # run id -> its task
        self._wake = asyncio.Event()
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> AlignmentRunner:
        self._loop = asyncio.create_task(self._run(), name="alignment runs")
        return self

    def wake(self) -> None:
        """A run was started here: look now, not at the next poll."""
        self._wake.set()

    async def close(self) -> None:
        """Stop grading; each run's lease is given back, so another process resumes it at once."""
        tasks = [t for t in (self._loop, *self._grading.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                await self._look()
            except Exception:  # Redis away: the next poll looks again
                log.warning("looking for alignment runs failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), POLL_S)
            self._wake.clear()

    # 1-2. The runs not ended, and the ones this process takes.
    async def _look(self) -> None:
        for run_id, judge_id in (await self._store.active()).items():
            if run_id in self._grading or len(self._grading) >= AT_ONCE:
                continue
            run = await self._store.get(judge_id, run_id)
            if run is None or run.state != "running":
                await self._store.end(judge_id, run_id)  # gone, or ended by a process that died before this
                continue
            if not await self._store.lease(judge_id, run_id, self._owner):
                continue
            task = asyncio.create_task(self._grade(run), name=f"alignment {run_id}")
            self._grading[run_id] = task
            task.add_done_callback(lambda _, run_id=run_id: self._grading.pop(run_id, None))  # type: ignore[misc]

    # 3-4. One run, from where its verdicts end.
    async def _grade(self, run: Alignment) -> None:
        store, state = self._store, {"run": run}
        grading = {"done": 0, "stored": 0}  # verdicts stored, and of the chunk being graded

        async def save(update: dict[str, object], work_bytes: int = 0) -> None:
            """The run as stored now (a shadow stopped meanwhile stays stopped), with ``update``;
            the lease renewed first - a run another process took is not written from here."""
            if not await store.lease(run.judge_id, run.id, self._owner):
                raise LeaseLost(run.id)
            stored = await store.get(run.judge_id, run.id)
            state["run"] = (stored or state["run"]).model_copy(update={**update, "updated_at": _now()})
            await store.save(state["run"], work_bytes)

        ticking: asyncio.Task[None] | None = None
        try:
            found = await store.work(run.judge_id, run.id)
            if found is None:  # ended elsewhere meanwhile
                await store.end(run.judge_id, run.id)
                return
            work, work_bytes = found
            verdicts = await store.verdicts(run.judge_id, run.id)
            grading["stored"] = len(verdicts)

            async def saver() -> None:
                while True:
                    await asyncio.sleep(SAVE_EVERY_S)
                    with contextlib.suppress(Exception):  # a lease lost is found at the chunk's end
                        await save({"done": grading["stored"] + grading["done"]}, work_bytes)

            ticking = asyncio.create_task(saver())
            cases = work.case_list()
            catalog = await self._catalog(work)
            for role in ROLES:
                todo = [c for c in cases if f"{role}:{c.id}" not in verdicts]
                for start in range(0, len(todo), CHUNK):
                    chunk = todo[start:start + CHUNK]
                    grading["done"] = 0
                    scored = await self._scores(catalog, f"{run.id}:{role}", _judge_id(work, role), run, chunk,
                                                grading)
                    if not await store.lease(run.judge_id, run.id, self._owner):
                        raise LeaseLost(run.id)  # paid for, and counted; its verdicts are the new owner's to make
                    fresh = {f"{role}:{c.id}": v for c, v in zip(chunk, scored, strict=True)}
                    await store.add_verdicts(run, fresh)
                    verdicts.update(fresh)
                    grading["stored"], grading["done"] = len(verdicts), 0
            await _stopped(ticking)  # no progress save lands after the last
            await save(await _figures(run, cases, verdicts))
            await store.end(run.judge_id, run.id)
        except asyncio.CancelledError:  # a shutdown: another process resumes the run
            with contextlib.suppress(Exception):
                await self._give_back(run)
            raise
        except LeaseLost:  # this process stalled past its lease: the run is another's now
            log.warning("an alignment run was taken over by another process", alignment=run.id)
        except Exception as exc:
            if not_the_subjects_fault(exc):  # Redis away: the run is resumed once it is back
                log.warning("an alignment run stopped; it resumes at a later look", alignment=run.id, error=repr(exc))
                with contextlib.suppress(Exception):
                    await self._give_back(run)
                return
            # The run's own: it says so, and ends - if it is still this process's to end.
            log.exception("an alignment run failed", alignment=run.id, judge=run.judge_id)
            with contextlib.suppress(LeaseLost):
                await save({"state": "failed", "error": f"grading failed ({type(exc).__name__})",
                            "finished_at": _now()})
                await store.end(run.judge_id, run.id)
        finally:
            if ticking is not None:
                await _stopped(ticking)

    async def _give_back(self, run: Alignment) -> None:
        """This process stops grading ``run``: its lease is let go if still ours (a shutdown: another
        process resumes the run at its next look)."""
        lease = keys.alignment_lease(run.judge_id, run.id)
        if await self._redis.get(lease) == self._owner.encode():
            await self._redis.delete(lease)

    async def _catalog(self, work: AlignmentWork) -> CatalogSnapshot:
        """The catalog with the judges as the run began: the current one and the candidate."""
        catalog = await CatalogStore(self._redis).snapshot()
        candidate_id = _judge_id(work, "candidate")
        return catalog.changed({("judges", work.judge.id): work.judge,
                                ("judges", candidate_id): work.candidate.model_copy(update={"id": candidate_id})})

    async def _scores(self, catalog: CatalogSnapshot, run_id: str, judge_id: str, run: Alignment,
                      cases: list[Case], grading: dict[str, int]) -> list[float | None]:
        """Each case's verdict by one judge (None: no room in the budget, or it could not score)."""
        assert run.project_id is not None
        group = ScorerGroup(id=f"alignment:{run_id}", name="alignment", project_id=run.project_id,
                            members=[Member(kind="judge", ref_id=judge_id, weight=1)])
        plan = GradingPlan(group, [])
        rows = [DatasetRow(input=c.input, output=c.output, id=c.id) for c in cases]
        spend = RunSpend(Claims(self._redis), run_id, plan, catalog, self._engine.panel.pricing)

        def progressed(_: int, __: int) -> None:
            grading["done"] += 1

        try:
            granted = await spend.reserve(rows)
            graded = await grade_rows(self._engine.panel, catalog, plan, granted, spends=spend.spends,
                                      progress=progressed)
            await spend.settle(graded)
        finally:
            await spend.close()
        by_row = {str(r.row.id): r.rating for r in graded.rows}
        return [by_row.get(str(row.id)) for row in rows]


async def _figures(run: Alignment, cases: list[Case], verdicts: dict[str, float | None]) -> dict[str, object]:
    """4: both judges' figures on the cases both scored, as the run's update."""
    old: list[float] = []
    new: list[float] = []
    scored: list[Case] = []
    for case in cases:
        current, candidate = verdicts.get(f"current:{case.id}"), verdicts.get(f"candidate:{case.id}")
        if current is not None and candidate is not None:
            scored.append(case)
            old.append(current)
            new.append(candidate)
    humans = [c.human for c in scored]
    # The bootstraps are CPU work (400 resamples of up to 1,000 cases): off the API's loop.
    figures = await asyncio.to_thread(judge_figures, old, humans)
    proposed = await asyncio.to_thread(judge_figures, new, humans)
    assert run.counts is not None
    return {"state": "done", "done": run.total, "current": figures, "candidate_figures": proposed,
            "better": better(figures, proposed), "changed": changed(scored, old, new),
            "counts": run.counts.model_copy(update={"budget_skipped": len(cases) - len(scored)}),
            "finished_at": _now()}


async def _stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _judge_id(work: AlignmentWork, role: str) -> str:
    return work.judge.id if role == "current" else f"{work.judge.id}~candidate"


def _now() -> datetime:
    return datetime.now(UTC)
