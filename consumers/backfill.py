"""The backfill runner: every worker runs one; the workers share a job's partitions through leases in Redis.

Each tick the jobs not ended take turns (``turn_order``). A job's turn: 1. resume, 2. plan once, 3. lease
each partition not read to its end, 4. read it, 5. claim and score a chunk of pairs, 6. advance its offset,
7. done. The one rule: the live loop's offsets are never touched and live traffic goes first; a pair rated
under the group's current revision is never graded again. The steps in full: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from adapters.stores.backfills import BackfillStore, JobCap, JobParts
from adapters.stores.claims import ClaimResult
from adapters.stores.keys import DEDUPE_DONE_TTL_S
from consumers.all_of import all_of
from consumers.backfill_plan import plan_ranges
from consumers.decode import DeadLetter, decode_trace
from consumers.outage import OutageTooLong
from consumers.pair_protocol import Fate, PairOutcome, PairProtocol
from consumers.periodic import every
from consumers.range_reads import reading, started
from scorer_groups.api_models import BACKFILL_ENDED, BackfillJob
from scoring.catalog import CatalogSnapshot
from scoring.errors import NotFound
from scoring.models import ScorerGroup
from scoring.prices import Pricing
from scoring.results import ResultScope
from scoring.routing import DEFAULT_BUDGET_WINDOW_S, DEFAULT_MAX_SPANS_PER_TRACE, Pair, group_pairs

log = structlog.get_logger(__name__)

BATCH = 200  # records read at once from one partition
CONCURRENCY = 32  # pairs of a batch claimed and scored at once: a backfill never floods the judges
LIVE_FIRST_WAIT_S = 0.2  # how often a backfill held back by live traffic looks again
READ_TURN_S = 10.0  # how long one job reads before the next turn (``turn_order``)
LIVE_SHARE = 0.2  # of each budget window's judge calls, what a backfill leaves to live traffic


@dataclass
class Graded:
    """What became of one batch: where the partition reached, and the job's counts."""

    reached: int
    traces: int = 0  # the job's project's traces of the window, up to ``reached``
    scored: int = 0
    skipped: int = 0
    calls_returned: int = 0  # calls counted against maxJudgeCalls for pairs not scored here
    budget_out: bool = False  # the project's budget refused a pair: pause
    cap_reached: bool = False  # maxJudgeCalls refused a pair: the job ends


class BackfillRunner:
    def __init__(self, *, jobs: BackfillStore, parts: JobParts, pairs: PairProtocol, alerting: PairProtocol,
                 catalog: Callable[[], CatalogSnapshot], consumer: Callable[[], AIOKafkaConsumer], topic: str,
                 worker: str, max_trace_bytes: int, max_spans: int = DEFAULT_MAX_SPANS_PER_TRACE,
                 live_pressed: Callable[[], bool] = lambda: False,
                 live_done: Callable[[], Awaitable[dict[int, int]]] | None = None, interval_s: float = 2.0) -> None:
        self._jobs, self._parts = jobs, parts
        self._protocols = {False: pairs, True: alerting}  # by the job's ``alerts``
        self._catalog, self._consumer, self._topic = catalog, consumer, topic
        self._worker, self._max_trace_bytes, self._max_spans = worker, max_trace_bytes, max_spans
        self._live_pressed, self._live_done, self._interval_s = live_pressed, live_done, interval_s

    async def run(self, stop: asyncio.Event) -> None:
        for protocol in self._protocols.values():
            protocol.start()
        try:
            await every(self._interval_s, lambda: self.tick(stop), stop, name="the backfill runner")
        finally:
            for protocol in self._protocols.values():
                await protocol.close(self._interval_s)

    async def tick(self, stop: asyncio.Event) -> None:
        jobs = await self._waiting()
        for job_id in turn_order(jobs):
            if stop.is_set():
                return
            try:
                await self._turn(job_id, stop)
            except NotFound:  # its document is gone (removed by hand): no longer looked at
                await self._parts.forget(job_id)
            except OutageTooLong:
                raise  # the outage rule: the worker stops, and is restarted
            except Exception:  # this job's turn is lost; the others go on, the next tick tries again
                log.exception("backfill turn failed; retrying on the next tick", job=job_id)

    async def _waiting(self) -> list[BackfillJob]:
        """The jobs a turn may move now: not ended, nor paused until a later budget window."""
        jobs = []
        for job_id in await self._parts.active():
            try:
                job = await self._jobs.get(job_id)
            except NotFound:  # its document is gone (removed by hand): no longer looked at
                await self._parts.forget(job_id)
                continue
            if job.status in BACKFILL_ENDED:
                await self._parts.ended(job_id)
            elif not (job.status == "paused" and job.resume_at is not None and job.resume_at > datetime.now(UTC)):
                jobs.append(job)
        return jobs

    async def _turn(self, job_id: str, stop: asyncio.Event) -> None:
        job = await self._jobs.get(job_id)
        if job.status in BACKFILL_ENDED:
            await self._parts.ended(job_id)
            return
        if job.status == "paused":  # 1.
            if job.resume_at is None or job.resume_at > datetime.now(UTC):
                return
            await self._parts.resume(job_id)
            log.info("backfill resumed: a new budget window", job=job_id)
        if job.status == "queued":  # 2.
            if not await self._parts.try_plan(job_id, self._worker):
                return
            await self._plan(job)
        parts = await self._parts.parts(job_id)
        turn_ends = time.monotonic() + READ_TURN_S
        for partition, part in sorted(parts.items()):  # 3.
            if part["next"] < part["end"] and await self._parts.lease(job_id, partition, self._worker):
                if not await self._read(job, partition, part, stop, turn_ends) or time.monotonic() > turn_ends:
                    return  # paused, ended, stopping or its turn is over
        parts = await self._parts.parts(job_id)
        if all(p["next"] >= p["end"] for p in parts.values()):  # 7. (a plan of no partition too)
            await self._parts.finish(job_id)

    async def _plan(self, job: BackfillJob) -> None:
        from_ms, to_ms = int(job.from_.timestamp() * 1000), int(job.to.timestamp() * 1000)
        notes = []
        remembered_ms = int((time.time() - DEDUPE_DONE_TTL_S) * 1000)
        if from_ms < remembered_ms:  # older pairs' done marks are gone: live's ratings would be made again
            from_ms = remembered_ms
            notes.append(f"starts at {datetime.fromtimestamp(from_ms / 1000, UTC).isoformat(timespec='seconds')}: "
                         f"older traffic's ratings are no longer known ({DEDUPE_DONE_TTL_S // 86_400} days), "
                         "and would be made twice")
        live_done = await self._live_done() if self._live_done is not None else None
        async with started(self._consumer) as consumer:
            plan = await plan_ranges(consumer, self._topic, from_ms, max(from_ms, to_ms), live_done)
        await self._parts.save_plan(job.id, {r.partition: (r.start, r.end) for r in plan.ranges},
                                    [*notes, *plan.notes])

    async def _read(self, job: BackfillJob, partition: int, part: dict[str, int], stop: asyncio.Event,
                    turn_ends: float) -> bool:
        """4-6 for one leased partition, until its range's end; False when the job may not go
        on here now (paused, ended, cancelled, the worker stopping, the job's turn over)."""

        async def go_on() -> bool:
            """Live traffic first (the lease kept meanwhile); then: the job still running, the
            partition still this worker's."""
            while self._live_pressed() and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=LIVE_FIRST_WAIT_S)
                await self._parts.lease(job.id, partition, self._worker)
            return (not stop.is_set() and await self._parts.status(job.id) == "running"
                    and await self._parts.lease(job.id, partition, self._worker))

        async with reading(self._consumer, TopicPartition(self._topic, partition), part["next"],
                           part["end"]) as reader:
            reached, fetched = part["next"], False
            while reached < part["end"]:
                # A turn fetches once at least (a turn shorter than a fetch still moves its job).
                if (fetched and time.monotonic() > turn_ends) or not await go_on():
                    return False
                fetched = True
                snapshot = self._catalog()
                group = snapshot.groups.get(job.group_id)
                if group is None:
                    await self._parts.finish(job.id, "failed", "the group was deleted")
                    return False
                records = await reader.next_batch(BATCH)
                if records is None:  # read to its end (its last offsets perhaps without a record)
                    await self._parts.advance(job.id, partition, part["end"])
                    return True
                if not records:
                    continue
                graded = await self._grade(job, records, group, snapshot, go_on)
                await self._parts.advance(job.id, partition, graded.reached, tracesRead=graded.traces,
                                          pairsScored=graded.scored, pairsSkipped=graded.skipped,
                                          judgeCalls=-graded.calls_returned)
                if graded.budget_out:
                    resume_at = self._next_window(group, snapshot)
                    if await self._parts.pause(job.id, resume_at):
                        log.info("backfill paused: the project's judge budget is spent", job=job.id,
                                 resume_at=resume_at.isoformat())
                    return False
                if graded.cap_reached:
                    await self._parts.finish(job.id, note=f"stopped at maxJudgeCalls ({job.max_judge_calls}) "
                                                          f"while reading partition {partition}")
                    return False
                if graded.reached < records[-1].offset + 1:  # not reached: stopping, taken over, cancelled
                    return False
                reached = graded.reached
            return True

    async def _grade(self, job: BackfillJob, records: list[Any], group: ScorerGroup, snapshot: CatalogSnapshot,
                     go_on: Callable[[], Awaitable[bool]]) -> Graded:
        """5 for one batch, a chunk of pairs at a time, while ``go_on``. Returns the offset the
        partition may advance to: the first record with a pair not graded, else past the batch.
        A chunk at a time: a worker killed mid-batch leaves at most a chunk's claims and calls
        counted behind it, and a cancel stops the job within a chunk."""
        protocol = self._protocols[job.alerts]
        at, own = self._pairs(job, records, group, snapshot, protocol.pricing)
        graded = Graded(reached=records[-1].offset + 1)
        cap = JobCap(self._parts, job.id, job.max_judge_calls)
        # A group that waits on nothing (no judge, no external scorer) is scored a whole batch at
        # once, in bulk (one sandbox message per code scorer), as live scoring does; one that
        # waits, 32 pairs at a time: a backfill never floods the judges live traffic shares.
        bulk = not protocol.waits(group, snapshot)
        size = BATCH if bulk else CONCURRENCY
        for first in range(0, len(at), size):
            if not await go_on():  # the batch is read again from here, by whoever goes on with it
                graded.reached = at[first][0]
                break
            chunk = at[first:first + size]
            calls = [pair.claim.judge_calls for _, pair in chunk]
            fits = await self._parts.reserve_calls(job.id, job.max_judge_calls, calls)
            if fits < len(chunk):
                graded.cap_reached, graded.reached = True, chunk[fits][0]
                chunk = chunk[:fits]
            claimed_at = time.monotonic()  # (no later than the claim: a lease's age is never underestimated)
            try:
                states = await protocol.claim([pair for _, pair in chunk], snapshot)
            except BaseException:  # nothing claimed: nothing will be spent
                await self._parts.give_calls(job.id, sum(calls[:fits]))
                raise
            refused = await self._score(chunk, states, claimed_at, protocol, snapshot, cap, graded, bulk)
            if refused:  # the budget (or the cap, for calls decided while scoring) said no here
                graded.reached = min(refused)
                graded.budget_out, graded.cap_reached = not cap.refused, cap.refused
                break
            if graded.cap_reached:
                break
        graded.traces = sum(offset < graded.reached for offset in own)
        return graded

    def _pairs(self, job: BackfillJob, records: list[Any], group: ScorerGroup, snapshot: CatalogSnapshot,
               pricing: Pricing) -> tuple[list[tuple[int, Pair]], list[int]]:
        """The batch's pairs by record offset: records stamped within the window, traces that
        decode (a malformed one was dead-lettered live), routed as live would route them; the
        claims leave live traffic its share of the budget. And the offsets of the job's
        project's traces of the window: what its ``tracesRead`` counts."""
        from_ms, to_ms = job.from_.timestamp() * 1000, job.to.timestamp() * 1000
        at: list[tuple[int, Pair]] = []
        own: list[int] = []
        for record in records:
            if not from_ms <= record.timestamp < to_ms:
                continue  # read for records out of time order (the plan's hour past the end)
            trace = decode_trace(record.topic, record.partition, record.offset, record.key, record.value,
                                 self._max_trace_bytes)
            if isinstance(trace, DeadLetter):
                continue
            if trace.project_id == job.project_id:
                own.append(record.offset)
            try:
                pairs = group_pairs(trace, group, snapshot, sample_rate=job.sample_rate, max_spans=self._max_spans,
                                    pricing=pricing)
            except Exception:  # a trace that breaks routing was dead-lettered live: not graded here either
                log.warning("a trace could not be routed; not graded", job=job.id, offset=record.offset,
                            exc_info=True)
                continue
            at += [(record.offset, _leaving_live_its_share(pair)) for pair in pairs]
        return at, own

    @staticmethod
    async def _score(chunk: list[tuple[int, Pair]], states: list[ClaimResult], claimed_at: float,
                     protocol: PairProtocol, snapshot: CatalogSnapshot, cap: JobCap, graded: Graded,
                     bulk: bool) -> list[int]:
        """Score and publish a claimed chunk of pairs (``bulk``: the free ones together),
        counting into ``graded``; the offsets of the pairs refused for budget (or the cap)."""
        refused: list[int] = []
        mine: list[tuple[int, Pair, bool, int]] = []  # with the calls the cap holds for it
        for (offset, pair), state in zip(chunk, states, strict=True):
            if state.state in ("claimed", "busy"):
                held_calls = pair.claim.judge_calls
                if state.state == "claimed" and held_calls and pair.verdicts.keys:
                    # verdicts paid for already (the verdict cache): calls the cap need not hold
                    graded.calls_returned += held_calls - state.calls
                    held_calls = state.calls
                mine.append((offset, pair, state.state == "busy", held_calls))
                continue
            graded.calls_returned += pair.claim.judge_calls
            if state.state == "exhausted":
                refused.append(offset)
            else:
                graded.skipped += 1  # already rated under this revision
        if not mine:
            return refused
        scope: ResultScope = "trace" if mine[0][1].subject.scope == "trace" else "span"  # one group's pairs
        if bulk:  # the free pairs in one go; those another worker holds are waited for, each
            mine = [m for m in mine if not m[2]] + [m for m in mine if m[2]]
            free = [pair for _, pair, busy, _ in mine if not busy]

            async def held(pair: Pair) -> list[PairOutcome]:
                return [await protocol.alone(pair, snapshot, scope, busy=True, claimed_at=claimed_at)]

            parts = await all_of(protocol.together(free, snapshot, scope, claimed_at=claimed_at, lost="wait"),
                                 *(held(pair) for _, pair, busy, _ in mine if busy))
            outcomes: list[PairOutcome] = [outcome for part in parts for outcome in part]
        else:
            outcomes = await all_of(*(protocol.alone(pair, snapshot, scope, busy=busy, claimed_at=claimed_at,
                                                     cap=cap) for _, pair, busy, _ in mine))
        for (offset, _, _, held_calls), outcome in zip(mine, outcomes, strict=True):
            if outcome.fate is Fate.PUBLISHED:
                graded.scored += 1
                continue
            graded.calls_returned += held_calls
            if outcome.fate is Fate.REFUSED:
                refused.append(offset)
            else:
                graded.skipped += 1  # rated by another worker meanwhile, or a subject that broke scoring
        return refused

    @staticmethod
    def _next_window(group: ScorerGroup, snapshot: CatalogSnapshot) -> datetime:
        """The start of the project's next judge-budget window (budgets count in fixed windows)."""
        budget = snapshot.budget(group.project_id)
        window_s = budget.window_seconds if budget is not None else DEFAULT_BUDGET_WINDOW_S
        return datetime.fromtimestamp((int(time.time()) // window_s + 1) * window_s, UTC)


def turn_order(jobs: list[BackfillJob]) -> list[str]:
    """A tick's turns: the projects one after another (by id), each turn going to the project's
    next job (by creation), until every job has had one - a project of fewer jobs gives each of
    them more turns, so each project has as many turns as the others, whatever its jobs."""
    of_project: dict[str, list[str]] = {}
    for job in sorted(jobs, key=lambda j: (j.created_at, j.id)):
        of_project.setdefault(job.project_id, []).append(job.id)
    rounds = max((len(ids) for ids in of_project.values()), default=0)
    return [ids[n % len(ids)] for n in range(rounds) for _, ids in sorted(of_project.items())]


def _leaving_live_its_share(pair: Pair) -> Pair:
    """The pair with a budget ``LIVE_SHARE`` lower - its calls, tokens and money caps and its
    group's day: a backfill never takes what live traffic needs of a window (its claims and
    reservations are refused first, and the job pauses)."""
    claim = pair.claim
    if claim.calls_cap is None and claim.group_cost_cap is None:
        return pair

    def lower(cap: int | None) -> int | None:
        return None if cap is None else int(cap * (1 - LIVE_SHARE))

    return dataclasses.replace(pair, claim=dataclasses.replace(
        claim, calls_cap=lower(claim.calls_cap), tokens_cap=lower(claim.tokens_cap),
        cost_cap=lower(claim.cost_cap), group_cost_cap=lower(claim.group_cost_cap)))
