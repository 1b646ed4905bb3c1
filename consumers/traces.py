"""The live loop: ingested traces in; ratings, Signals and webhook deliveries out.

The trace step of a ``consumers.loop.PartitionLoop``: decode, route, claim, score, finish. The one rule:
a trace is finished only once every output is acknowledged and its pairs are marked done, so a commit
never passes unfinished work and a redelivered pair never spends budget again.
The steps and the flow control: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener

from adapters.stores import keys
from adapters.stores.alerts import NoScoreAlerts
from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from consumers.all_of import all_of
from consumers.decode import DeadLetter, decode_trace, unprocessable
from consumers.events import SILENT, PipelineEvents
from consumers.judge_export import JudgeCallSink
from consumers.loop import MAX_POLL_INTERVAL_S, SLICE_S, PartitionLoop, Taken
from consumers.outage import OutageGuard
from consumers.outputs import Outputs, TopicNames
from consumers.pair_protocol import FINISH_LINGER_S, PairOutcome, PairProtocol
from consumers.pauses import PauseWatch
from scoring.catalog import CatalogSnapshot
from scoring.errors import ScoringError
from scoring.filters import HEADER_PROJECT, MAX_ROUTING_HEADER_BYTES, ROUTING_HEADERS, HeaderView
from scoring.panel import Panel
from scoring.results import ResultScope
from scoring.routing import DEFAULT_MAX_SPANS_PER_TRACE, Pair, route
from scoring.subjects import Trace

log = structlog.get_logger(__name__)

MAX_BATCH = 1000  # records a fetch takes at most


class TurnRecorder(Protocol):
    """Where session-scope turns go (the sessions sweeper reads them)."""

    async def add_turns(self, traces: list[Trace], now: float | None = None) -> None: ...


@dataclass(frozen=True)
class TraceLoopLimits:
    max_in_flight: int = 256  # traces being scored at once
    max_in_flight_bytes: int = 256 << 20  # and the bytes of their records
    max_trace_bytes: int = 1 << 20
    commit_interval_s: float = 1.0
    finish_linger_s: float = FINISH_LINGER_S
    max_poll_interval_s: float = MAX_POLL_INTERVAL_S
    max_spans_per_trace: int = DEFAULT_MAX_SPANS_PER_TRACE  # a span-scope group's, per trace

    @property
    def max_batch(self) -> int:
        # A batch of at most half the room: while one waits (the sandbox, the broker's
        # acknowledgements, Redis), the next is decoded and scored. One batch the size of the
        # room left the loop idle through every wait (measured: 0.72 of a core busy draining a
        # backlog); smaller ones pay each batch's round trips and sandbox fork more often.
        return min(MAX_BATCH, max(1, self.max_in_flight // 2))


@dataclass
class _TraceWork:
    """One trace's pairs in a batch job: it is finished when the last of them is."""

    taken: Taken
    pending: int
    started: float
    size: int  # the record's bytes, held until the trace is finished
    broken: Exception | None = None


class OutputError(ScoringError):
    """An output could not be published or recorded: the worker must stop without committing."""


class TraceConsumer:
    def __init__(self, *, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, topics: TopicNames,
                 catalog: Callable[[], CatalogSnapshot], panel: Panel, claims: Claims, ratings: RatingsStore,
                 turns: TurnRecorder | None = None, events: PipelineEvents | None = None,
                 outages: OutageGuard | None = None, alerts: NoScoreAlerts | None = None,
                 pauses: PauseWatch | None = None, limits: TraceLoopLimits = TraceLoopLimits(),
                 judge_calls: JudgeCallSink | None = None) -> None:
        self._catalog = catalog
        self._turns = turns
        self._events: PipelineEvents = events or SILENT
        self._limits = limits
        # Redis or the broker unreachable: steps wait (parked, not fetching) instead of failing.
        outages = outages or OutageGuard()
        self.loop = PartitionLoop(name="traces", consumer=consumer, producer=producer, dlq_topic=topics.dlq,
                                  outages=outages, commit_interval_s=limits.commit_interval_s,
                                  max_batch=limits.max_batch, max_poll_interval_s=limits.max_poll_interval_s,
                                  events=self._events)
        outputs = Outputs(producer, topics, self._events, alerts, judge_calls=judge_calls)
        self.pairs = PairProtocol(claims=claims, outputs=outputs,
                                  ratings=ratings, panel=panel, outages=outages, events=self._events, pauses=pauses,
                                  finish_batch=max(1, limits.max_in_flight // 8),
                                  finish_linger_s=limits.finish_linger_s)
        # Jobs running, with the traces each has not finished yet: jobs of revoked partitions
        # still count against the room once their partitions' offsets are forgotten.
        self._jobs: dict[asyncio.Task[None], list[_TraceWork]] = {}
        self._failure: BaseException | None = None

    # --- what the worker sees ------------------------------------------------------------------

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        return self.loop.rebalance_listener()

    @property
    def fatal(self) -> BaseException | None:
        return self._failure or self.pairs.failure

    @property
    def outage(self) -> str | None:
        return self.loop.outage

    @property
    def assigned_once(self) -> bool:
        return self.loop.assigned_once

    @property
    def last_progress(self) -> float:
        return self.loop.last_progress

    @property
    def last_commit_advance(self) -> float:
        return self.loop.last_commit_advance

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set or an output fails; then drain (see ``drain``)."""
        self.pairs.start()
        watching = asyncio.create_task(self.pairs.pauses.run(stop_watching := asyncio.Event()), name="pause-watch")
        try:
            await self.loop.run(self, stop)
        finally:
            stop_watching.set()
            await watching
        if self.fatal is not None:
            raise OutputError("an output could not be published; stopping without committing it") from self.fatal

    async def drain(self, deadline_s: float) -> None:
        """Shutdown: finish in-flight jobs within ``deadline_s``, cancel the rest and give up
        their leases, then commit what is finished."""
        if self._jobs:
            log.info("draining in-flight traces", traces=len(self._jobs), deadline_s=deadline_s)
            _, pending = await asyncio.wait(list(self._jobs), timeout=deadline_s)
            if pending:
                log.warning("cancelling traces that did not finish in time", traces=len(pending))
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        await self.pairs.close(deadline_s)
        await self.commit()

    async def commit(self) -> None:
        try:
            await self.loop.commit()
        except Exception as exc:  # at shutdown: what is not committed is redelivered
            log.warning("final commit failed; the records are redelivered", error=repr(exc))

    # --- the step (consumers.loop.Step) ------------------------------------------------------------

    def room(self) -> int:
        # Jobs of revoked partitions still run: they count against the room too.
        unfinished = [w for works in self._jobs.values() for w in works if w.pending]
        in_flight = max(self.loop.tracker.in_flight(), len(unfinished))
        room = self._limits.max_in_flight - in_flight
        if room <= 0 or sum(w.size for w in unfinished) >= self._limits.max_in_flight_bytes:
            self.pairs.finisher.hurry()  # pairs published but not yet marked done hold the room
            return 0
        # With work in flight, fetch once an eighth of the room is free: a backlog then comes in
        # batches that share their claims' round trip, not a few traces each time a pair ends.
        return 0 if in_flight and room < self._limits.max_in_flight // 8 else room

    def ended(self) -> bool:
        return self.fatal is not None

    def pressed(self) -> bool:
        """Live traffic needs this worker: a backlog behind the loop (more than its room), or
        half its room in flight. Work that can wait - a backfill - waits while it is."""
        in_flight = self.loop.tracker.in_flight()
        if in_flight >= max(1, self._limits.max_in_flight // 2):
            return True
        return sum(self.loop.lag().values()) > self._limits.max_in_flight

    async def tick(self) -> None:
        counts = self.pairs.counts
        if counts.starved or counts.matched or counts.traffic:  # counted once a commit interval
            await counts.write(wait=False)  # counts never hold back a commit
        for tp, behind in self.loop.lag().items():
            self._events.lag(tp.topic, tp.partition, behind)

    async def take(self, batch: list[Taken]) -> None:
        snapshot = self._catalog()  # one catalog version for the whole batch
        started = time.monotonic()
        self._events.consumed(len(batch))
        # 1. decode: a record whose routing headers say no live group can want it is finished
        #    unparsed; the others are decoded, malformed ones dead-lettered with their reason.
        traces: list[tuple[Taken, Trace]] = []
        dead: list[tuple[Taken | None, DeadLetter]] = []
        filtered: Counter[tuple[str, str]] = Counter()  # counted per batch, not per trace
        traffic: Counter[tuple[str, int]] = Counter()  # each project's records by hour (its estimates' scale)
        hour_now = int(time.time() * 1000) // keys.TRAFFIC_BUCKET_MS  # once a batch, not a record
        for taken in batch:
            record = taken.record
            unwanted = self._unwanted_by(record.headers, snapshot, filtered) if record.headers else None
            if unwanted is not None:
                self._count(traffic, snapshot, unwanted, record.timestamp, hour_now)
                taken.ticket.finished(record.offset)
                continue
            decoded = decode_trace(record.topic, record.partition, record.offset, record.key,
                                   record.value, self._limits.max_trace_bytes)
            if isinstance(decoded, DeadLetter):
                dead.append((taken, decoded))
            else:
                self._count(traffic, snapshot, decoded.project_id, record.timestamp, hour_now)
                traces.append((taken, decoded))
        self.pairs.counts.traffic.update(traffic)

        # 2. route: each group's filter, then its sample (scoring.routing). Nothing a tenant sends
        #    may raise out of this loop: a trace that breaks routing is dead-lettered with the
        #    reason, and the others go on. In slices: the loop is given back every SLICE_S.
        routed: list[tuple[Taken, Trace, list[Pair]]] = []
        turns: list[Trace] = []
        kept: Counter[tuple[str, str]] = Counter()
        slice_ends = time.monotonic() + SLICE_S
        for taken, trace in traces:
            if time.monotonic() > slice_ends:
                await asyncio.sleep(0)
                slice_ends = time.monotonic() + SLICE_S
            try:
                decided = route(trace, snapshot, self._limits.max_spans_per_trace, self.pairs.pricing)
            except Exception as exc:
                dead.append((taken, self._unprocessable(taken, "routing", exc)))
                continue
            routed.append((taken, trace, decided.pairs))
            kept.update((trace.project_id, pair.group.id) for pair in decided.pairs)
            filtered.update((trace.project_id, group) for group in decided.filtered)
            self.pairs.counts.matched.update(decided.matched)
            for (group, why), count in decided.skipped.items():  # past a span cap, a bound, the regex time
                self._events.group_skipped(trace.project_id, group, why, count)
            if decided.regex_cut:
                self._events.regex_text_cut(trace.project_id, decided.regex_cut)
            if decided.turn:
                turns.append(trace)
        for (project, group), count in kept.items():
            self._events.kept(project, group, count)
        for (project, group), count in filtered.items():
            self._events.filtered(project, group, count)
        await self.loop.dead_letter(dead)
        if turns and self._turns is not None:
            # Session-scope groups never score a single trace: they judge the conversation later.
            recorder = self._turns
            await self.loop.outages.call(lambda: recorder.add_turns(turns))

        # 3. claim
        claims = await self.pairs.claim([pair for *_, pairs in routed for pair in pairs], snapshot)

        # 4. one job for the batch: pairs that wait on nothing (patterns, code scorers) are scored
        #    together; pairs that wait (judges, external scorers, another worker's lease) each
        #    alone, so none holds back the others.
        together: list[tuple[Pair, _TraceWork]] = []
        alone: list[tuple[Pair, bool, _TraceWork]] = []
        works: list[_TraceWork] = []
        cursor = 0
        for taken, trace, pairs in routed:
            states = claims[cursor:cursor + len(pairs)]
            cursor += len(pairs)
            work: list[tuple[Pair, bool]] = []
            for pair, claim in zip(pairs, states, strict=True):
                if claim.state in ("claimed", "busy"):
                    work.append((pair, claim.state == "busy"))
                elif claim.state != "exhausted":  # done/skipped: a redelivery of a decided pair
                    self._events.group_skipped(trace.project_id, pair.group.id, "dedupe")
            if not work:
                taken.ticket.finished(taken.record.offset)
                continue
            tracked = _TraceWork(taken, pending=len(work), started=started, size=len(taken.record.value or b""))
            works.append(tracked)
            for pair, busy in work:
                if busy or self.pairs.waits(pair.group, snapshot):
                    alone.append((pair, busy, tracked))
                else:
                    together.append((pair, tracked))
        if works:
            task = asyncio.create_task(self._job(together, alone, snapshot, started))
            self._jobs[task] = works
            task.add_done_callback(self._job_done)
        self._events.in_flight(self.loop.tracker.in_flight())

    # --- 5. a batch's job, and finishing its traces --------------------------------------------------

    async def _job(self, together: list[tuple[Pair, _TraceWork]], alone: list[tuple[Pair, bool, _TraceWork]],
                   snapshot: CatalogSnapshot, claimed_at: float) -> None:
        async def scored_together(scope: ResultScope) -> None:
            chunk = [(pair, work) for pair, work in together if pair.subject.scope == scope]
            if not chunk:
                return
            outcomes = await self.pairs.together([pair for pair, _ in chunk], snapshot, scope,
                                                 claimed_at=claimed_at, lost="wait")
            for (_, work), outcome in zip(chunk, outcomes, strict=True):
                await self._pair_finished(work, outcome)

        async def scored_alone(pair: Pair, busy: bool, work: _TraceWork) -> None:
            scope: ResultScope = "span" if pair.subject.scope == "span" else "trace"
            outcome = await self.pairs.alone(pair, snapshot, scope, busy=busy, claimed_at=claimed_at)
            await self._pair_finished(work, outcome)

        # Trace-scope and span-scope pairs (one step of a trace each) of the batch, in one job.
        await all_of(scored_together("trace"), scored_together("span"), *(scored_alone(*item) for item in alone))

    async def _pair_finished(self, work: _TraceWork, outcome: PairOutcome) -> None:
        """Count one pair of a trace as done; the trace is finished with its last pair (or, if
        any of its pairs broke scoring, dead-lettered)."""
        work.pending -= 1
        if outcome.error is not None:
            work.broken = work.broken or outcome.error
        if work.pending:
            return
        if work.broken is not None:
            # The trace broke scoring (not an outage): dead-letter it; its other pairs are out.
            await self.loop.dead_letter([(work.taken, self._unprocessable(work.taken, "scoring", work.broken))])
        else:
            work.taken.ticket.finished(work.taken.record.offset)
        self._events.latency(time.monotonic() - work.started)

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.pop(task, None)
        self.loop.freed()
        if not task.cancelled() and task.exception() is not None and self._failure is None:
            self._failure = task.exception()

    @staticmethod
    def _unwanted(headers: Sequence[tuple[str, bytes]], snapshot: CatalogSnapshot,
                  filtered: Counter[tuple[str, str]]) -> bool:
        """Do the record's routing headers show that no live group of its project wants it? Then
        it is never parsed (a record without them is decided on its decoded trace)."""
        return TraceConsumer._unwanted_by(headers, snapshot, filtered) is not None

    @staticmethod
    def _unwanted_by(headers: Sequence[tuple[str, bytes]], snapshot: CatalogSnapshot,
                     filtered: Counter[tuple[str, str]]) -> str | None:
        """``_unwanted``, answering the project it decided for (None: parse the record)."""
        try:  # headers are the producer's: any that do not read as expected mean "parse it"
            fields = {name: value.decode(errors="replace") for name, value in headers
                      if name in ROUTING_HEADERS and isinstance(value, bytes)}
            if not HeaderView.complete(fields) or any(len(v) > MAX_ROUTING_HEADER_BYTES for v in fields.values()):
                return None
            project = fields[HEADER_PROJECT]
            if snapshot.wanted(project, HeaderView(fields)):
                return None
        except Exception:
            return None
        filtered.update((project, group.id) for group in snapshot.live_groups_of(project))
        return project

    @staticmethod
    def _count(traffic: Counter[tuple[str, int]], snapshot: CatalogSnapshot, project: str, at_ms: int,
               hour_now: int) -> None:
        """A record in its project's traffic index: only a project with groups (what an estimate
        is for; any other name a producer writes costs no Redis), and only within the index's
        time (a record stamped far off is no hour an estimate reads)."""
        hour = at_ms // keys.TRAFFIC_BUCKET_MS
        if project in snapshot.index.groups_by_project and \
                abs(hour - hour_now) <= keys.TRAFFIC_TTL_S * 1000 // keys.TRAFFIC_BUCKET_MS:
            traffic[(project, hour)] += 1

    def _unprocessable(self, taken: Taken, step: str, exc: BaseException) -> DeadLetter:
        record = taken.record
        log.warning("a trace broke a step; dead-lettered", step=step, error=repr(exc)[:300],
                    topic=record.topic, partition=record.partition, offset=record.offset)
        return unprocessable(record.topic, record.partition, record.offset, record.key, record.value,
                             f"{step} failed: {type(exc).__name__}: {str(exc)[:300]}", self._limits.max_trace_bytes)

