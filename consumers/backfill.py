"""The backfill runner (issue 42): every worker runs one; the workers share a job's partitions
through leases in Redis.

Each tick, for every job not ended:

1. a paused job whose budget window has turned resumes (any worker; the state moves once);
2. plan it once (one worker, under a lock): the offsets its window covers per partition
   (``consumers.backfill_plan``), stored with the job;
3. for each partition whose range is not read to its end: lease it (one reader per partition
   of a job; a killed worker's lease runs out and another takes the partition from its reached
   offset);
4. read the range in bounded batches with a consumer of its own (assigned, no group: the live
   loop's offsets are never touched), and only while the live loop is not pressed (live traffic
   first); keep the pairs of the job's group as live would at the job's sample
   (``scoring.routing.group_pairs``);
5. count their judge calls against ``maxJudgeCalls``, then claim, score, publish and mark done
   through a ``PairProtocol`` whose claims fill (``Claims``: a pair rated under the group's
   current revision is never graded again) and whose outputs say origin "backfill", at the
   trace's own time, paging nobody unless the job asked;
6. advance the partition's reached offset and the job's counts - up to the first pair the
   budget refused: the job then pauses until the project's next budget window, and reads on
   from there;
7. a job whose every partition is read to its end is done; one that reached ``maxJudgeCalls``
   is done too, and says where it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.backfill_plan import plan_ranges
from consumers.decode import DeadLetter, decode_trace
from consumers.pairs import PairOutcome, PairProtocol, all_of
from scorer_groups.api_models import BACKFILL_ENDED, BackfillJob
from scoring.catalog import CatalogSnapshot
from scoring.models import ScorerGroup
from scoring.routing import DEFAULT_BUDGET_WINDOW_S, DEFAULT_MAX_SPANS_PER_TRACE, Pair, group_pairs
from scoring.stores.backfills import BackfillStore, JobParts

log = structlog.get_logger(__name__)

BATCH = 200  # records read at once from one partition
CONCURRENCY = 32  # pairs of a batch scored at once: a backfill never floods the judges live traffic shares
LIVE_FIRST_WAIT_S = 0.2  # how often a backfill held back by live traffic looks again


@dataclass
class Graded:
    """What became of one batch: where the partition reached, and the job's counts."""

    reached: int
    scored: int = 0
    skipped: int = 0
    calls_returned: int = 0  # calls counted against maxJudgeCalls for pairs not scored here
    budget_out: bool = False  # the project's budget refused a pair: pause
    cap_reached: bool = False  # maxJudgeCalls refused a pair: the job ends


class BackfillRunner:
    def __init__(self, *, jobs: BackfillStore, parts: JobParts, pairs: PairProtocol, alerting: PairProtocol,
                 catalog: Callable[[], CatalogSnapshot], consumer: Callable[[], AIOKafkaConsumer], topic: str,
                 worker: str, max_trace_bytes: int, max_spans: int = DEFAULT_MAX_SPANS_PER_TRACE,
                 live_pressed: Callable[[], bool] = lambda: False, interval_s: float = 2.0) -> None:
        self._jobs, self._parts = jobs, parts
        self._protocols = {False: pairs, True: alerting}  # by the job's ``alerts``
        self._catalog, self._consumer, self._topic = catalog, consumer, topic
        self._worker, self._max_trace_bytes, self._max_spans = worker, max_trace_bytes, max_spans
        self._live_pressed, self._interval_s = live_pressed, interval_s

    async def run(self, stop: asyncio.Event) -> None:
        for protocol in self._protocols.values():
            protocol.start()
        try:
            while not stop.is_set():
                try:
                    await self.tick(stop)
                except Exception:  # one job's failure costs a tick; the next tries again
                    log.exception("backfill tick failed; retrying on the next tick")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self._interval_s)
        finally:
            for protocol in self._protocols.values():
                await protocol.close(self._interval_s)

    async def tick(self, stop: asyncio.Event) -> None:
        for job_id in await self._parts.active():
            job = await self._jobs.get(job_id)
            if job.status in BACKFILL_ENDED:
                continue
            if job.status == "paused":  # 1.
                if job.resume_at is None or job.resume_at > datetime.now(UTC):
                    continue
                await self._parts.resume(job_id)
                log.info("backfill resumed: a new budget window", job=job_id)
            if job.status == "queued":  # 2.
                if not await self._parts.try_plan(job_id, self._worker):
                    continue
                await self._plan(job_id, int(job.from_.timestamp() * 1000), int(job.to.timestamp() * 1000))
            parts = await self._parts.parts(job_id)
            for partition, part in sorted(parts.items()):  # 3.
                if part["next"] < part["end"] and await self._parts.lease(job_id, partition, self._worker):
                    if not await self._read(job_id, partition, part, stop):
                        break  # paused, ended or stopping: no other partition of it now
            parts = await self._parts.parts(job_id)
            if parts and all(p["next"] >= p["end"] for p in parts.values()):  # 7.
                await self._parts.finish(job_id)

    async def _plan(self, job_id: str, from_ms: int, to_ms: int) -> None:
        consumer = self._consumer()
        await consumer.start()
        try:
            plan = await plan_ranges(consumer, self._topic, from_ms, to_ms)
        finally:
            await consumer.stop()
        await self._parts.save_plan(job_id, {r.partition: (r.start, r.end) for r in plan.ranges}, list(plan.notes))

    async def _read(self, job_id: str, partition: int, part: dict[str, int], stop: asyncio.Event) -> bool:
        """4-6 for one leased partition, until its range's end; False when the job may not go
        on here (paused, ended, the worker stopping)."""
        tp = TopicPartition(self._topic, partition)
        consumer = self._consumer()
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, part["next"])
            reached = part["next"]
            while reached < part["end"]:
                while self._live_pressed() and not stop.is_set():  # live traffic first
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=LIVE_FIRST_WAIT_S)
                job = await self._jobs.get(job_id)
                if stop.is_set() or job.status != "running":
                    return False
                snapshot = self._catalog()
                group = snapshot.groups.get(job.group_id)
                if group is None:
                    await self._parts.finish(job_id, "failed", "the group was deleted")
                    return False
                batch = (await consumer.getmany(tp, timeout_ms=1000, max_records=BATCH)).get(tp, [])
                records = [r for r in batch if r.offset < part["end"]]
                if not records:
                    # Offsets without a record (transaction markers, records retention removed:
                    # the consumer starts from the earliest there is) are passed by the
                    # position alone: the range is read once the position is at its end.
                    if await consumer.position(tp) >= part["end"]:
                        await self._parts.advance(job_id, partition, part["end"])
                        return True
                    continue
                graded = await self._grade(job, records, group, snapshot, stop,
                                           renew=lambda: self._parts.lease(job_id, partition, self._worker))
                await self._parts.advance(job_id, partition, graded.reached, tracesRead=graded.reached - reached,
                                          pairsScored=graded.scored, pairsSkipped=graded.skipped,
                                          judgeCalls=-graded.calls_returned)
                if graded.cap_reached:
                    await self._parts.finish(job_id, note=f"stopped at maxJudgeCalls ({job.max_judge_calls}): "
                                                          f"partition {partition} was read to offset {graded.reached}")
                    return False
                if graded.budget_out:
                    resume_at = self._next_window(group, snapshot)
                    if await self._parts.pause(job_id, resume_at):
                        log.info("backfill paused: the project's judge budget is spent", job=job_id,
                                 resume_at=resume_at.isoformat())
                    return False
                if graded.reached < records[-1].offset + 1:  # stopped early: stopping, or taken over
                    return False
                reached = graded.reached
            return True
        finally:
            await consumer.stop()

    async def _grade(self, job: BackfillJob, records: list[Any], group: ScorerGroup, snapshot: CatalogSnapshot,
                     stop: asyncio.Event, renew: Callable[[], Awaitable[bool]]) -> Graded:
        """5 for one batch, a chunk of pairs at a time: the partition's lease renewed, the chunk's
        judge calls counted against the cap, its pairs claimed, scored, published. Returns the
        offset the partition may advance to: the first record with a pair not graded - refused
        by the budget or the cap, or not reached (the worker stopping, the lease lost) - else
        past the batch. A chunk at a time: a worker killed mid-batch leaves at most a chunk's
        claims and calls counted behind it."""
        at: list[tuple[int, Pair]] = []
        for record in records:
            trace = decode_trace(record.topic, record.partition, record.offset, record.key, record.value,
                                 self._max_trace_bytes)
            if isinstance(trace, DeadLetter):
                continue  # dead-lettered when the live loop read it
            at += [(record.offset, pair) for pair in group_pairs(trace, group, snapshot, sample_rate=job.sample_rate,
                                                                 max_spans=self._max_spans)]
        graded = Graded(reached=records[-1].offset + 1)
        protocol = self._protocols[job.alerts]
        for first in range(0, len(at), CONCURRENCY):
            # Stopping, or the partition taken over (this worker stalled past its lease): the
            # batch is read again from here, by whoever holds the partition.
            if stop.is_set() or not await renew():
                graded.reached = at[first][0]
                break
            chunk = at[first:first + CONCURRENCY]
            fits = await self._parts.reserve_calls(job.id, job.max_judge_calls, [p.claim.judge_calls for _, p in chunk])
            if fits < len(chunk):
                graded.cap_reached, graded.reached = True, chunk[fits][0]
                chunk = chunk[:fits]
            refused = await self._chunk(chunk, protocol, snapshot, graded)
            if refused:
                graded.budget_out, graded.reached = True, min(refused)
                break
            if graded.cap_reached:
                break
        return graded

    @staticmethod
    async def _chunk(chunk: list[tuple[int, Pair]], protocol: PairProtocol, snapshot: CatalogSnapshot,
                     graded: Graded) -> list[int]:
        """Claim, score and publish a chunk of pairs, counting into ``graded``; the offsets of
        the pairs the budget refused."""
        claimed_at = time.monotonic()
        states = await protocol.claim([pair for _, pair in chunk])
        refused: list[int] = []
        mine: list[tuple[int, Pair, bool]] = []
        for (offset, pair), state in zip(chunk, states, strict=True):
            if state.state in ("claimed", "busy"):
                mine.append((offset, pair, state.state == "busy"))
            elif state.state == "exhausted":
                refused.append(offset)
            else:
                graded.skipped += 1  # already rated under this revision
            if state.state != "claimed":
                graded.calls_returned += pair.claim.judge_calls
        outcomes: list[PairOutcome] = await all_of(*(
            protocol.alone(pair, snapshot, "trace" if pair.subject.scope == "trace" else "span", busy=busy,
                           claimed_at=claimed_at) for _, pair, busy in mine))
        for (offset, pair, busy), outcome in zip(mine, outcomes, strict=True):
            if outcome == "published":
                graded.scored += 1
            elif outcome == "decided" and not busy:  # its judges found no budget once its gates passed
                refused.append(offset)
                graded.calls_returned += pair.claim.judge_calls
            else:
                graded.skipped += 1  # rated by another worker meanwhile, or a subject that broke scoring
        return refused

    @staticmethod
    def _next_window(group: ScorerGroup, snapshot: CatalogSnapshot) -> datetime:
        """The start of the project's next judge-budget window (budgets count in fixed windows)."""
        budget = snapshot.budget(group.project_id)
        window_s = budget.window_seconds if budget is not None else DEFAULT_BUDGET_WINDOW_S
        return datetime.fromtimestamp((int(time.time()) // window_s + 1) * window_s, UTC)
