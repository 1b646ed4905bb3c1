"""The live loop: ingested traces in; ratings, Signals and webhook deliveries out.

Each turn of the loop is a short list of steps:

1. make room: pause the partitions while ``max_in_flight`` traces are being scored (and, with
   work in flight, until an eighth of the room is free again), polling them meanwhile only as
   often as staying in the consumer group needs;
2. fetch a batch (``getmany``), no larger than the room left nor half the whole room;
3. decode it: malformed records go to the dead-letter topic with their reason;
4. route it: the project's live trace-scope groups, sampled per (trace, group); session-scope
   groups only record the turn;
5. claim it: one pipelined Redis round trip dedupes every (group, trace) pair and reserves each
   group's judge calls all or nothing;
6. start one job for the batch: pairs that wait on nothing are scored, published and marked
   done in bulk; pairs that wait (judges, external scorers) each on their own - the pair
   protocol of ``consumers.pairs`` either way, its confirmations, reservations and done marks
   batched across jobs;
7. commit, on a timer: per partition, the offset below which every trace is finished.

A job finishes its trace only once every output is acknowledged by the broker and its pair is
marked done, so a commit never passes unfinished work (at-least-once), and a redelivered pair
is skipped without spending budget again (no double spend).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from consumers.batcher import Batcher
from consumers.decode import DeadLetter, decode_trace, unprocessable
from consumers.events import NoEvents, PipelineEvents
from consumers.offsets import Committer, PartitionOffsets
from consumers.outage import OutageGuard, OutageTooLong
from consumers.outputs import Outputs, TopicNames
from consumers.pairs import Finished, PairSteps, Scored
from consumers.pauses import PauseWatch
from scoring.catalog import CatalogSnapshot
from scoring.errors import ScoringError
from scoring.pairs import ClaimRequest
from scoring.panel import GroupResult, Panel
from scoring.routing import Pair, trace_pairs
from scoring.stores.alerts import NoScoreAlerts
from scoring.stores.claims import Claims, PairSpend, Reservation
from scoring.stores.ratings import RatingsStore
from scoring.subjects import Trace

log = structlog.get_logger(__name__)

BUSY_POLL_S = 0.5  # how often a pair leased by another worker is looked at again
# Done marks and history wait up to this long for more pairs to share their Redis call. Short: a
# pair published but not yet marked done is scored again should this worker die meanwhile (a
# judge may then answer differently under the same rating id), so the window stays small.
FINISH_LINGER_S = 0.05
# A judge pair's rating waits this long at most for other pairs' confirmations to share its call.
CONFIRM_LINGER_S = 0.02
MAX_BATCH = 1000  # records a fetch takes at most
# The consumer's max_poll_interval_ms (aiokafka's default): a loop with no room still polls
# within a quarter of it, so that the consumer stays in its group.
MAX_POLL_INTERVAL_S = 300.0


class TurnRecorder(Protocol):
    """Where session-scope turns go (the sessions sweeper reads them)."""

    async def record(self, traces: list[Trace], now: float | None = None) -> None: ...


@dataclass
class _TraceWork:
    """One trace's pairs in a batch job: it is finished when the last of them is."""

    ticket: PartitionOffsets
    record: Any
    pending: int
    started: float
    broken: Exception | None = None


class OutputError(ScoringError):
    """An output could not be published or recorded: the worker must stop without committing."""


class TraceConsumer:
    def __init__(
        self,
        *,
        consumer: AIOKafkaConsumer,
        producer: AIOKafkaProducer,
        topics: TopicNames,
        catalog: Callable[[], CatalogSnapshot],
        panel: Panel,
        claims: Claims,
        ratings: RatingsStore,
        turns: TurnRecorder | None = None,
        events: PipelineEvents | None = None,
        max_in_flight: int = 256,
        max_trace_bytes: int = 1 << 20,
        commit_interval_s: float = 1.0,
        outages: OutageGuard | None = None,
        alerts: NoScoreAlerts | None = None,
        finish_linger_s: float = FINISH_LINGER_S,
        pauses: PauseWatch | None = None,
        max_poll_interval_s: float = MAX_POLL_INTERVAL_S,
    ) -> None:
        self._consumer = consumer
        self._producer = producer
        self._topics = topics
        self._catalog = catalog
        self._panel = panel
        self._claims = claims
        self._ratings = ratings
        self._turns = turns
        self._events: PipelineEvents = events or NoEvents()
        self._outputs = Outputs(producer, topics, self._events, alerts)
        self._steps = PairSteps(claims, self._outputs, ratings, self._events)  # the pair protocol
        self._max_in_flight = max_in_flight
        self._max_trace_bytes = max_trace_bytes
        # Redis or the broker unreachable: steps wait (parked, not fetching) instead of failing.
        self._outages = outages or OutageGuard(tolerance_s=120.0)
        self._commit_failing_since: float | None = None
        self._committer = Committer(consumer, commit_interval_s)
        self._offsets = self._committer.tracker
        # Each job's claims not yet being published: what to give up if it must be cancelled.
        self._jobs: dict[asyncio.Task[None], set[ClaimRequest]] = {}
        # Traces each job has not finished yet: jobs of revoked partitions still count against the
        # room once their partitions' offsets are forgotten.
        self._job_traces: dict[asyncio.Task[None], list[_TraceWork]] = {}
        # Publishing is shielded from cancellation: a pair whose outputs are on their way is
        # finished (marked done), never cancelled halfway and scored again elsewhere.
        self._publishing: set[asyncio.Task[None]] = set()
        self._room = asyncio.Event()
        self._poll_at_least_every_s = max_poll_interval_s / 4
        # A batch of at most half the room: while one waits (the sandbox, the broker's
        # acknowledgements, Redis), the next is decoded and scored. One batch the size of the
        # room left the loop idle through every wait (measured: 0.72 of a core busy draining a
        # backlog); smaller ones pay each batch's round trips and sandbox fork more often.
        self._max_batch = min(MAX_BATCH, max(1, max_in_flight // 2))
        self._last_poll = time.monotonic()
        # Cut short when pairs waiting to be finished fill an eighth of the room, or the room runs out.
        self._finisher: Batcher[Finished, None] = Batcher(self._write_finished, max_items=max(1, max_in_flight // 8),
                                                          max_wait_s=finish_linger_s)
        # A pair scored alone (a judge's) confirms its lease before publishing: confirmations of
        # pairs that finish together go in one script call, not one each.
        self._confirmer: Batcher[ClaimRequest, bool] = Batcher(self._confirm_many, max_wait_s=CONFIRM_LINGER_S)
        # Budget asked for while pairs are scored (gates-first judges, retries): batched too.
        self._reserver: Batcher[Reservation, bool] = Batcher(self._reserve_many)
        self._pauses = pauses or PauseWatch()
        self._stop_watching = asyncio.Event()
        self._fatal: BaseException | None = None
        self.assigned_once = False
        self.last_progress = time.monotonic()  # the loop's heartbeat, for /readyz
        self.last_commit_advance = time.monotonic()

    # --- lifecycle ---------------------------------------------------------------------------

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        def assigned(_: set[TopicPartition]) -> None:
            self.assigned_once = True

        return self._committer.listener(lambda revoked: self.commit(only=revoked), assigned)

    @property
    def fatal(self) -> BaseException | None:
        return self._fatal

    @property
    def outage(self) -> str | None:
        """What this loop is waiting for (Redis, the broker), or None when all answer."""
        if self._commit_failing_since is not None:
            lasted = time.monotonic() - self._commit_failing_since
            if lasted > self._committer.interval_s * 3:
                return f"offset commits failing for {lasted:.0f}s"
        return self._outages.reason

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set or an output fails; then drain (see ``drain``)."""
        self._finisher.start()
        self._confirmer.start()
        self._reserver.start()
        watching = asyncio.create_task(self._pauses.run(self._stop_watching), name="pause-watch")
        try:
            while not stop.is_set() and self._fatal is None:
                await self._step()
        finally:
            self._stop_watching.set()
            await watching
        if self._fatal is not None:
            raise OutputError("an output could not be published; stopping without committing it") \
                from self._fatal

    async def drain(self, deadline_s: float) -> None:
        """Shutdown: finish in-flight jobs within ``deadline_s``, cancel the rest and give up
        their leases, then commit what is finished."""
        if self._jobs:
            log.info("draining in-flight traces", traces=len(self._jobs), deadline_s=deadline_s)
            _, pending = await asyncio.wait(list(self._jobs), timeout=deadline_s)
            if pending:
                log.warning("cancelling traces that did not finish in time", traces=len(pending))
                unpublished = [claim for task in pending for claim in self._jobs.get(task, ())]
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                with contextlib.suppress(Exception):
                    await self._claims.release(unpublished)
        if self._publishing:  # shielded: they finish (outputs acknowledged, marked done)
            _, running = await asyncio.wait(self._publishing, timeout=deadline_s)
            if running:  # outputs perhaps out, not marked done: their pairs may be scored again
                log.error("publishes did not finish in time", publishes=len(running))
                self._fatal = self._fatal or TimeoutError(f"{len(running)} publishes did not finish in time")
        await self._confirmer.stop()
        await self._reserver.stop()
        await self._finisher.stop()
        with contextlib.suppress(Exception):  # counts only: written if Redis answers now, never waited for
            await self._steps.record_skipped()
        with contextlib.suppress(KafkaError):
            await self.commit()

    # --- the loop ----------------------------------------------------------------------------

    async def _step(self) -> None:
        # Jobs of revoked partitions still run: they count against the room too.
        unfinished = sum(1 for works in self._job_traces.values() for w in works if w.pending)
        in_flight = max(self._offsets.in_flight(), unfinished)
        room = self._max_in_flight - in_flight
        # With work in flight, fetch once an eighth of the room is free: a backlog then comes in
        # batches that share their claims' round trip, not a few traces each time a pair ends.
        if room <= 0 or (in_flight and room < self._max_in_flight // 8):
            self._consumer.pause(*self._consumer.assignment())
            self._room.clear()
            if room <= 0:
                self._finisher.hurry()  # pairs published but not yet marked done hold the room
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), timeout=self._committer.interval_s)
            # A consumer that stops polling for max_poll_interval_ms leaves the group, and its
            # partitions (and leases) go to someone else: poll while paused, but only as often as
            # that needs. A poll of a paused partition throws away what the fetcher had already
            # read of it, to be read again from the broker on resume.
            batches = {}
            if time.monotonic() - self._last_poll >= self._poll_at_least_every_s:
                batches = await self._poll(timeout_ms=0, max_records=1)
        else:
            paused = self._consumer.paused()
            if paused:
                self._consumer.resume(*paused)
            batches = await self._poll(timeout_ms=100, max_records=min(room, self._max_batch))
        if batches:
            await self._handle(batches)
        self.last_progress = time.monotonic()
        if self._committer.due:
            await self._record_skipped()
            try:
                await self.commit()
                self._commit_failing_since = None
            except KafkaError as exc:  # a rebalance under way, or the broker away: the next tick commits again
                log.warning("commit failed; retrying on the next tick", error=repr(exc))
                self._commit_failed(exc)
            self._report_lag()

    async def _poll(self, *, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        batches: dict[TopicPartition, list[Any]] = await self._outages.call(
            lambda: self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records))
        self._last_poll = time.monotonic()
        return batches

    async def _record_skipped(self) -> None:
        """Pairs skipped for budget since the last commit, counted in the history once a commit."""
        if self._steps.starved:
            await self._outages.call(self._steps.record_skipped)

    def _commit_failed(self, exc: KafkaError) -> None:
        now = time.monotonic()
        self._commit_failing_since = self._commit_failing_since or now
        if now - self._commit_failing_since > self._outages.tolerance_s:
            raise OutageTooLong(f"offsets could not be committed for {now - self._commit_failing_since:.0f}s, past "
                                f"the tolerance of {self._outages.tolerance_s:g}s: {exc!r}") from exc

    async def _handle(self, batches: dict[TopicPartition, list[Any]]) -> None:
        snapshot = self._catalog()  # one catalog version for the whole batch
        started = time.monotonic()
        assigned = self._consumer.assignment()
        traces: list[tuple[PartitionOffsets, Any, Trace]] = []
        dead: list[tuple[PartitionOffsets, int, DeadLetter]] = []
        count = 0
        # Every record is started before the first await: a rebalance can run during an await,
        # and a record must never be tracked under a partition that was already given away.
        for tp, records in batches.items():
            if tp not in assigned:
                continue  # revoked since the fetch: the new owner reads these records
            for record in records:
                count += 1
                ticket = self._offsets.started(tp, record.offset)
                decoded = decode_trace(tp.topic, tp.partition, record.offset, record.key, record.value,
                                       self._max_trace_bytes)
                if isinstance(decoded, DeadLetter):
                    dead.append((ticket, record.offset, decoded))
                else:
                    traces.append((ticket, record, decoded))
        self._events.consumed(count)

        # Nothing a tenant sends may raise out of this loop: a trace that breaks routing is
        # dead-lettered with the reason, and the others go on.
        pairs_by_trace = []
        kept: Counter[tuple[str, str]] = Counter()  # counted per batch, not per pair
        for ticket, record, trace in traces:
            try:
                pairs = trace_pairs(trace, snapshot)
            except Exception as exc:
                dead.append((ticket, record.offset, self._unprocessable(record, "routing", exc)))
                continue
            pairs_by_trace.append((ticket, record, trace, pairs))
            kept.update((trace.project_id, pair.group.id) for pair in pairs)
        for (project, group), count in kept.items():
            self._events.kept(project, group, count)
        await self._dead_letter(dead)
        if self._turns is not None:
            # Session-scope groups never score a single trace: they judge the conversation later.
            turns = [trace for _, _, trace, _ in pairs_by_trace
                     if trace.session_id and snapshot.live_groups(trace.project_id, "session")]
            if turns:
                recorder = self._turns
                await self._outages.call(lambda: recorder.record(turns))
        requests = [p.claim for *_, pairs in pairs_by_trace for p in pairs]
        claims = await self._outages.call(lambda: self._claims.claim_many(requests))
        # 6. One job for the batch: pairs that wait on nothing (patterns, code scorers) are scored
        #    in bulk; pairs that wait (judges, external scorers, another worker's lease) each on
        #    their own, so none holds back the others.
        bulk: list[tuple[Pair, _TraceWork]] = []
        each: list[tuple[Pair, bool, _TraceWork]] = []
        job_traces: list[_TraceWork] = []
        cursor = 0
        for ticket, record, trace, pairs in pairs_by_trace:
            states = claims[cursor:cursor + len(pairs)]
            cursor += len(pairs)
            work: list[tuple[Pair, bool]] = []
            for pair, claim in zip(pairs, states, strict=True):
                if claim.state == "claimed":
                    work.append((pair, False))
                elif claim.state == "busy":
                    work.append((pair, True))
                else:
                    # exhausted: no budget now; done/skipped: a redelivery of a decided pair.
                    if claim.state != "exhausted":
                        self._events.group_skipped(trace.project_id, pair.group.id, "dedupe")
                    if claim.state == "exhausted":
                        self._steps.skipped_for_budget(pair, used=claim.detail)
            if not work:
                ticket.finished(record.offset)
                continue
            tracked = _TraceWork(ticket, record, pending=len(work), started=started)
            job_traces.append(tracked)
            for pair, busy in work:
                if busy or self._panel.waits(pair.group, snapshot):
                    each.append((pair, busy, tracked))
                else:
                    bulk.append((pair, tracked))
        if bulk or each:
            unpublished = {pair.claim for pair, _ in bulk} | {pair.claim for pair, _, _ in each}
            task = asyncio.create_task(self._batch_job(bulk, each, unpublished, snapshot))
            self._jobs[task] = unpublished
            self._job_traces[task] = job_traces
            task.add_done_callback(self._job_done)
        self._events.in_flight(self._offsets.in_flight())

    # --- one trace -----------------------------------------------------------------------------

    async def _batch_job(self, bulk: list[tuple[Pair, _TraceWork]], each: list[tuple[Pair, bool, _TraceWork]],
                         unpublished: set[ClaimRequest], snapshot: CatalogSnapshot) -> None:
        await asyncio.gather(self._bulk(bulk, unpublished, snapshot),
                             *(self._one(pair, busy, work, snapshot, unpublished) for pair, busy, work in each))

    async def _bulk(self, bulk: list[tuple[Pair, _TraceWork]], unpublished: set[ClaimRequest],
                    snapshot: CatalogSnapshot) -> None:
        """Score, publish and record many pairs at once (one sandbox message per code scorer,
        one batch of records to the producer, one write of history and done marks)."""
        if not bulk:
            return
        began = time.monotonic()
        try:
            results = await self._panel.score_many([(pair.group, pair.subject) for pair, _ in bulk], snapshot)
        except (RedisError, KafkaError, OutageTooLong):
            raise
        except Exception:
            # Not an outage: some trace broke scoring. Score each pair alone to find which.
            await asyncio.gather(*(self._one(pair, False, work, snapshot, unpublished) for pair, work in bulk))
            return
        # Scored through a pause, with a member failed: handed back, then claimed and scored
        # again alone, as pairs lost to another worker are waited for.
        again: list[tuple[Pair, _TraceWork]] = []
        if self._pauses.since(began):
            paused = {i for i, result in enumerate(results) if self._pauses.failed_through(result, began)}
            if paused:
                again = [item for i, item in enumerate(bulk) if i in paused]
                await self._hand_back([pair for pair, _ in again])
                bulk = [item for i, item in enumerate(bulk) if i not in paused]
                results = [result for i, result in enumerate(results) if i not in paused]
        # Still ours? A worker that stalled past its leases may have lost pairs to another worker,
        # which scored them since: those are not published from here but waited for again.
        held = await self._held([(pair.claim, work.started) for pair, work in bulk])
        lost = [(pair, work) for (pair, work), ours in zip(bulk, held, strict=True) if not ours] + again
        scored = [(pair, result) for (pair, _), result, ours in zip(bulk, results, held, strict=True) if ours]
        for pair, _ in scored:
            unpublished.discard(pair.claim)  # from here on the pair is published (shielded)
        publishing = asyncio.create_task(self._publish([Scored(pair, result) for pair, result in scored], snapshot,
                                                       alone=False))
        self._publishing.add(publishing)
        publishing.add_done_callback(self._publishing.discard)
        await asyncio.gather(asyncio.shield(publishing),
                             *(self._one(pair, True, work, snapshot, unpublished) for pair, work in lost))
        for (_, work), ours in zip(bulk, held, strict=True):
            if ours:
                await self._pair_finished(work, None)

    async def _one(self, pair: Pair, busy: bool, work: _TraceWork, snapshot: CatalogSnapshot,
                   unpublished: set[ClaimRequest]) -> None:
        await self._pair_finished(work, await self._pair(pair, busy, work.started, snapshot, unpublished))

    async def _pair_finished(self, work: _TraceWork, failure: Exception | None) -> None:
        """Count one pair of a trace as done; the trace is finished with its last pair (or, if
        any of its pairs broke scoring, dead-lettered)."""
        work.pending -= 1
        work.broken = work.broken or failure
        if work.pending:
            return
        if work.broken is not None:
            # The trace broke scoring (not an outage): dead-letter it; its other pairs are out.
            await self._dead_letter([(work.ticket, work.record.offset,
                                      self._unprocessable(work.record, "scoring", work.broken))])
        else:
            work.ticket.finished(work.record.offset)
        self._events.latency(time.monotonic() - work.started)

    async def _pair(self, pair: Pair, busy: bool, claimed_at: float, snapshot: CatalogSnapshot,
                    unpublished: set[ClaimRequest]) -> Exception | None:
        """Score and publish one pair; return the exception if the trace itself broke scoring."""
        spend = self._steps.spend(pair, self._reserve_one)
        try:
            began = time.monotonic()
            result = await self._score(pair, busy, snapshot, spend)
            while result is not None:
                if self._pauses.failed_through(result, began):
                    await self._hand_back([pair])  # then claimed and scored afresh, just below
                # Still ours? A worker that stalled past its lease may have lost the pair to another
                # worker, which scored it since: publishing would put a second value under its id.
                elif (await self._held([(pair.claim, claimed_at)]))[0]:
                    break
                spend = self._steps.spend(pair, self._reserve_one)
                began = claimed_at = time.monotonic()  # claimed again (no earlier than this) in _score
                result = await self._score(pair, True, snapshot, spend)
        except (RedisError, KafkaError, OutageTooLong):
            raise  # an outage, not the trace's fault: the worker stops without committing
        except Exception as exc:
            unpublished.discard(pair.claim)
            with contextlib.suppress(Exception):
                await self._claims.release([pair.claim])
            return exc
        unpublished.discard(pair.claim)  # from here on the pair is published or was decided elsewhere
        if result is None:
            return None
        publishing = asyncio.create_task(self._publish([Scored(pair, result, spend)], snapshot, alone=True))
        self._publishing.add(publishing)
        publishing.add_done_callback(self._publishing.discard)
        await asyncio.shield(publishing)
        return None

    async def _hand_back(self, pairs: list[Pair]) -> None:
        """Give up the leases of pairs scored through a pause, to claim them again (their judge
        calls reserved anew) and score them afresh - or leave them to a worker that took them."""
        log.warning("a member failed while the process stood still; scoring its pair again",
                    pairs=len(pairs), pauses=self._pauses.pauses)
        self._events.rescored_after_pause(len(pairs))
        claims = [pair.claim for pair in pairs]
        await self._outages.call(lambda: self._claims.release(claims))

    async def _held(self, claims: list[tuple[ClaimRequest, float]]) -> list[bool]:
        """Whether this worker still holds each claim (taken no earlier than the monotonic time
        given with it). A lease expires only with time: one taken less than half its length ago
        has not - the clock here ran at least as long as the server's since - so only older ones
        (a stall, a long judge) are asked about, and renewed, batched with the other jobs'
        (``Claims.confirm``). A Redis failover that loses writes loses done marks and budget
        alike: that is replication's to prevent (persistence, replicas in sync), not a lease's.
        """
        now = time.monotonic()
        held = [True] * len(claims)
        stale = [i for i, (_, claimed_at) in enumerate(claims) if now - claimed_at >= self._claims.lease_s / 2]
        if stale:
            for i, ours in zip(stale, await self._confirmer.submit([claims[i][0] for i in stale]), strict=True):
                held[i] = ours
        return held

    async def _confirm_many(self, claims: list[ClaimRequest]) -> list[bool]:
        return await self._outages.call(lambda: self._claims.confirm(claims))

    async def _reserve_one(self, reservation: Reservation) -> bool:
        (granted,) = await self._reserver.submit([reservation])
        return granted

    async def _reserve_many(self, reservations: list[Reservation]) -> list[bool]:
        return await self._outages.call(lambda: self._claims.reserve_many(reservations))

    async def _publish(self, scored: list[Scored], snapshot: CatalogSnapshot, *, alone: bool) -> None:
        """Steps 4 to 6 of the pair protocol: publish, then record and mark done (batched)."""
        try:
            finished = await self._outages.call(lambda: self._steps.publish(scored, "trace", snapshot))
            await self._finisher.submit(finished)
        except Exception as exc:
            self._fatal = self._fatal or exc
            log.error("publishing a result failed; the worker stops without committing it" if alone else
                      "publishing results failed; the worker stops without committing them", error=repr(exc))
            raise

    def _job_done(self, task: asyncio.Task[None]) -> None:
        self._jobs.pop(task, None)
        self._job_traces.pop(task, None)
        self._room.set()
        if not task.cancelled() and task.exception() is not None and self._fatal is None:
            self._fatal = task.exception()

    async def _score(self, pair: Pair, busy: bool, snapshot: CatalogSnapshot, spend: PairSpend) -> GroupResult | None:
        """Score one pair; for a pair another worker holds, wait until it is done (None) or its
        lease expires (then it is ours, budget reserved again)."""
        while busy:
            await asyncio.sleep(BUSY_POLL_S)
            (claim,) = await self._outages.call(lambda: self._claims.claim_many([pair.claim]))
            if claim.state in ("done", "skipped", "exhausted"):
                self._events.group_skipped(pair.claim.project_id, pair.group.id,
                                           "budget" if claim.state == "exhausted" else "dedupe")
                return None
            busy = claim.state == "busy"
        return await self._steps.score(self._panel, pair, snapshot, spend)

    async def _write_finished(self, items: list[Finished]) -> None:
        await self._outages.call(lambda: self._steps.finish(items))

    def _unprocessable(self, record: Any, step: str, exc: BaseException) -> DeadLetter:
        log.warning("a trace broke a step; dead-lettered", step=step, error=repr(exc)[:300],
                    topic=record.topic, partition=record.partition, offset=record.offset)
        return unprocessable(record.topic, record.partition, record.offset, record.key, record.value,
                             f"{step} failed: {type(exc).__name__}: {str(exc)[:300]}", self._max_trace_bytes)

    async def _dead_letter(self, dead: list[tuple[PartitionOffsets, int, DeadLetter]]) -> None:
        """Send dead letters and wait for the broker's acknowledgement (under the outage guard):
        only then are their records finished."""
        if not dead:
            return
        for _, offset, letter in dead:
            self._events.dead_lettered(letter.reason)
            log.warning("dead-lettered a record", reason=letter.reason, error=letter.error[:300],
                        topic=letter.topic, partition=letter.partition, offset=offset)

        async def send_all() -> None:
            acks = [await self._producer.send(self._topics.dlq, key=letter.key.encode() if letter.key else None,
                                              value=letter.to_json()) for _, _, letter in dead]
            await asyncio.gather(*acks)

        await self._outages.call(send_all)
        for ticket, offset, _ in dead:
            ticket.finished(offset)
        self._room.set()

    # --- offsets -------------------------------------------------------------------------------

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit, per partition, the offset below which every trace is finished."""
        moves = await self._committer.commit(only)
        if not moves:
            return
        self.last_commit_advance = time.monotonic()
        for tp, offset in moves.items():
            self._events.committed(tp.topic, tp.partition, offset)

    def _report_lag(self) -> None:
        for tp in self._consumer.assignment():
            highwater = self._consumer.highwater(tp)
            position = self._offsets.committable(tp)
            if highwater is not None and position is not None:
                self._events.lag(tp.topic, tp.partition, max(0, highwater - position))

