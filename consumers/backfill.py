"""The backfill runner (issue 42): every worker runs one; the workers share a job's partitions
through leases in Redis.

Each tick, for every job not ended:

1. plan it once (one worker, under a lock): the offsets its window covers per partition
   (``consumers.backfill_plan``), stored with the job;
2. for each partition whose range is not read to its end: lease it (one reader per partition
   of a job; a killed worker's lease runs out and another takes the partition from its reached
   offset);
3. read the range in bounded batches with a consumer of its own (assigned, no group: the live
   loop's offsets are never touched); decode; keep the traces of the job's group that its filter
   passes and the job's sample keeps (the same traces a live group at that rate would keep);
4. claim, score, publish and mark done through a ``PairProtocol`` whose outputs say origin
   "backfill", page nobody unless the job asked, and count at the trace's own time; claims
   dedupe as live ones do, so a pair already rated is never scored again;
5. advance the partition's reached offset and the job's counts once the batch is done;
6. a job whose every partition is read to its end is done.

Not yet: pausing on an exhausted budget and ``maxJudgeCalls``, live traffic first (room and
lag), session scope, and the fraction in the job's progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from consumers.backfill_plan import plan_ranges
from consumers.decode import DeadLetter, decode_trace
from consumers.pairs import PairProtocol, all_of
from scoring.catalog import CatalogSnapshot
from scoring.filters import TraceView, compile_filter
from scoring.models import ScorerGroup
from scoring.pairs import day_of
from scoring.routing import Pair, pair_of
from scoring.sampling import keep
from scoring.stores.backfills import BackfillStore, JobParts
from scoring.subjects import trace_subject

log = structlog.get_logger(__name__)

BATCH = 200  # records read at once from one partition


class BackfillRunner:
    def __init__(self, *, jobs: BackfillStore, parts: JobParts, pairs: PairProtocol,
                 catalog: Callable[[], CatalogSnapshot], consumer: Callable[[], AIOKafkaConsumer], topic: str,
                 worker: str, max_trace_bytes: int, interval_s: float = 2.0) -> None:
        self._jobs, self._parts, self.pairs = jobs, parts, pairs
        self._catalog, self._consumer, self._topic = catalog, consumer, topic
        self._worker, self._max_trace_bytes, self._interval_s = worker, max_trace_bytes, interval_s

    async def run(self, stop: asyncio.Event) -> None:
        self.pairs.start()
        try:
            while not stop.is_set():
                try:
                    await self.tick(stop)
                except Exception:  # one job's failure costs a tick; the next tries again
                    log.exception("backfill tick failed; retrying on the next tick")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self._interval_s)
        finally:
            await self.pairs.close(self._interval_s)

    async def tick(self, stop: asyncio.Event) -> None:
        for job_id in await self._parts.active():
            job = await self._jobs.get(job_id)
            if job.status in ("done", "failed", "cancelled", "paused"):
                continue
            if job.status == "queued":
                if not await self._parts.try_plan(job_id, self._worker):
                    continue
                await self._plan(job_id, int(job.from_.timestamp() * 1000), int(job.to.timestamp() * 1000))
            parts = await self._parts.parts(job_id)
            for partition, part in sorted(parts.items()):
                if part["next"] < part["end"] and await self._parts.lease(job_id, partition, self._worker):
                    await self._read(job_id, partition, part, stop)
            parts = await self._parts.parts(job_id)
            if parts and all(p["next"] >= p["end"] for p in parts.values()):
                await self._parts.finish(job_id)

    async def _plan(self, job_id: str, from_ms: int, to_ms: int) -> None:
        consumer = self._consumer()
        await consumer.start()
        try:
            plan = await plan_ranges(consumer, self._topic, from_ms, to_ms)
        finally:
            await consumer.stop()
        await self._parts.save_plan(job_id, {r.partition: (r.start, r.end) for r in plan.ranges}, list(plan.notes))

    async def _read(self, job_id: str, partition: int, part: dict[str, int], stop: asyncio.Event) -> None:
        tp = TopicPartition(self._topic, partition)
        consumer = self._consumer()
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, part["next"])
            reached = part["next"]
            while reached < part["end"] and not stop.is_set():
                job = await self._jobs.get(job_id)
                if job.status == "cancelled":
                    return
                snapshot = self._catalog()
                group = snapshot.groups.get(job.group_id)
                if group is None:
                    await self._parts.finish(job_id, "failed", "the group was deleted")
                    return
                batch = (await consumer.getmany(tp, timeout_ms=1000, max_records=BATCH)).get(tp, [])
                records = [r for r in batch if r.offset < part["end"]]
                if not records:
                    continue
                scored, skipped = await self._score(records, group, job.sample_rate, snapshot)
                reached = records[-1].offset + 1
                await self._parts.advance(job_id, partition, reached, tracesRead=len(records),
                                          pairsScored=scored, pairsSkipped=skipped)
                await self._parts.lease(job_id, partition, self._worker)
        finally:
            await consumer.stop()

    async def _score(self, records: list[Any], group: ScorerGroup, rate: float,
                     snapshot: CatalogSnapshot) -> tuple[int, int]:
        """The batch's pairs of the job's group: filtered and sampled as live, claimed, scored,
        published and marked done (the pair protocol); (scored, skipped) counts."""
        passes = compile_filter(group.online.filter) if group.online and group.online.filter else None
        salt = (group.online.sample_salt or "") if group.online else ""
        pairs: list[Pair] = []
        for record in records:
            trace = decode_trace(record.topic, record.partition, record.offset, record.key, record.value,
                                 self._max_trace_bytes)
            if isinstance(trace, DeadLetter) or trace.project_id != group.project_id:
                continue  # not a trace of this project (a malformed one was dead-lettered live)
            if passes is not None and passes(TraceView(trace)) is not True:
                continue
            if not keep(trace.trace_id, rate, salt):
                continue
            pairs.append(pair_of(group, trace_subject(trace), snapshot, subject_key=f"trace:{trace.trace_id}",
                                 day=day_of(trace.timestamp.timestamp())))
        if not pairs:
            return 0, 0
        claimed_at = time.monotonic()
        states = await self.pairs.claim(pairs)
        mine = [(pair, state.state == "busy") for pair, state in zip(pairs, states, strict=True)
                if state.state in ("claimed", "busy")]
        outcomes = await all_of(*(self.pairs.alone(pair, snapshot, "trace", busy=busy, claimed_at=claimed_at)
                                  for pair, busy in mine))
        scored = sum(1 for outcome in outcomes if outcome == "published")
        return scored, len(pairs) - scored
