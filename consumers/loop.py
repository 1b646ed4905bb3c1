"""The one loop over a Kafka topic: the trace loop, the OTLP intake and the webhook sender each plug in a ``Step``.

Every record of a partition still assigned gets its offset ticket before the first await, and only the
offset below which every record is finished is committed. The one rule for a failed commit: an outage of
the broker, retried on the next tick, never a raise on the first failure. The turn's steps:
docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from consumers.events import SILENT
from consumers.offsets import Committer, OffsetTracker, PartitionOffsets
from consumers.outage import OutageGuard, OutageTooLong
from consumers.sender import send_records
from scoring.outbox import Record

log = structlog.get_logger(__name__)

# The consumer's max_poll_interval_ms (aiokafka's default): a loop with no room still polls
# within a quarter of it, so that the consumer stays in its group.
MAX_POLL_INTERVAL_S = 300.0
COMMIT_FAILURES_REPORTED_AFTER = 3  # commit intervals: one failure in a rebalance is ordinary
# A step doing a tenant's work item by item (routing a batch, assembling a page of sessions) gives
# the event loop back at least this often: an item's filters may spend up to their matching time
# (scoring.regex_work), and a batch of such items must not hold heartbeats, commits and other
# jobs behind all of them.
SLICE_S = 0.01

class Taken(NamedTuple):
    """A record a step took: its offset ticket (``ticket.finished(offset)`` once its work is
    done) and the record as the consumer read it."""

    ticket: PartitionOffsets
    record: Any


class Step(Protocol):
    """What a loop does with its topic's records."""

    def room(self) -> int:
        """How many more records the step can take now; 0 pauses the partitions."""
        ...

    async def take(self, batch: list[Taken]) -> None:
        """Work on a batch; finish each record's ticket when its work is done (see ``dead_letter``)."""
        ...

    async def tick(self) -> None:
        """On the commit timer, before the commit."""
        ...

    def ended(self) -> bool:
        """Whether the loop must stop (the step failed in a way only a restart mends)."""
        ...


class Letter(Protocol):
    """A value for a dead-letter topic, with why it is there."""

    @property
    def reason(self) -> str: ...

    @property
    def error(self) -> str: ...

    @property
    def kafka_key(self) -> bytes | None: ...

    def to_json(self) -> bytes: ...


class LoopEvents(Protocol):
    def dead_lettered(self, reason: str) -> None: ...
    def committed(self, topic: str, partition: int, offset: int) -> None: ...


class PartitionLoop:
    def __init__(self, *, name: str, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, dlq_topic: str,
                 outages: OutageGuard, commit_interval_s: float = 1.0, max_batch: int = 1000,
                 poll_timeout_ms: int = 100, max_poll_interval_s: float = MAX_POLL_INTERVAL_S,
                 events: LoopEvents | None = None) -> None:
        self.name = name  # in logs: "traces", "otlp", "webhooks"
        self.consumer = consumer
        self.outages = outages
        self.max_batch = max_batch
        self._producer = producer
        self.dlq_topic = dlq_topic
        self._poll_timeout_ms = poll_timeout_ms
        self._poll_at_least_every_s = max_poll_interval_s / 4
        self._events: LoopEvents = events or SILENT
        self._committer = Committer(consumer, commit_interval_s)
        self.tracker: OffsetTracker = self._committer.tracker
        self._freed = asyncio.Event()
        self._carried: dict[TopicPartition, list[Any]] = {}  # polled while held: taken on the next turn
        self._last_poll = time.monotonic()
        self._commit_failing_since: float | None = None
        self.assigned_once = False
        self.last_progress = time.monotonic()  # the loop's heartbeat, for /readyz
        self.last_commit_advance = time.monotonic()

    # --- what the worker sees ------------------------------------------------------------------

    @property
    def outage(self) -> str | None:
        """What this loop is waiting for (Redis, the broker, its commits), or None when all answer."""
        if self._commit_failing_since is not None:
            lasted = time.monotonic() - self._commit_failing_since
            if lasted > self._committer.interval_s * COMMIT_FAILURES_REPORTED_AFTER:
                return f"offset commits failing for {lasted:.0f}s"
        return self.outages.reason

    def rebalance_listener(self, *, assigned: Any = None, revoked: Any = None) -> ConsumerRebalanceListener:
        """Commit what is finished on partitions about to be revoked, then forget them; tell the
        step (``assigned(partitions)``, ``revoked(partitions)``) if it wants to know."""
        def on_assigned(partitions: set[TopicPartition]) -> None:
            self.assigned_once = True
            if assigned is not None:
                assigned(partitions)

        async def on_revoked(partitions: set[TopicPartition]) -> None:
            for tp in partitions:  # the new owner reads them (and from its own position)
                self._carried.pop(tp, None)
            try:
                await self.commit(only=partitions)
            finally:
                if revoked is not None:
                    revoked(partitions)

        return self._committer.listener(on_revoked, on_assigned)

    # --- the loop ------------------------------------------------------------------------------

    async def run(self, step: Step, stop: asyncio.Event) -> None:
        """Turn until ``stop`` is set or the step ended; then commit what is finished."""
        try:
            while not stop.is_set() and not step.ended():
                await self._turn(step)
        finally:
            with contextlib.suppress(KafkaError):
                await self.commit()

    async def _turn(self, step: Step) -> None:
        # 1. make room
        room = step.room()
        if room <= 0:
            self._freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), timeout=self._committer.interval_s)
            batches = await self._poll_paused()
        else:
            paused = self.consumer.paused()
            if paused:
                self.consumer.resume(*paused)
            # 2. fetch
            batches = await self._poll(timeout_ms=self._poll_timeout_ms, max_records=min(room, self.max_batch))
        # 3. tickets, before any await
        if self._carried:  # polled while held: before what this fetch brought, partition by partition
            carried, self._carried = self._carried, {}
            for tp, records in batches.items():
                carried.setdefault(tp, []).extend(records)
            batches = carried
        batch = self._tickets(batches)
        # 4. the step's work
        if batch:
            await step.take(batch)
        self.last_progress = time.monotonic()
        # 5. commit, on the timer
        if self._committer.due:
            await step.tick()
            await self._commit_on_tick()

    def freed(self) -> None:
        """The step freed room: a loop waiting for it fetches now."""
        self._freed.set()

    async def pause_for(self, seconds: float) -> None:
        """Pause every assigned partition for ``seconds`` while the step cannot take more (the
        OTLP buffer full), polling only as staying in the group needs; the step resumes them by
        having room again. What a poll returns meanwhile waits for the next turn."""
        await asyncio.sleep(seconds)
        for tp, records in (await self._poll_paused()).items():
            self._carried.setdefault(tp, []).extend(records)

    async def _poll_paused(self) -> dict[TopicPartition, list[Any]]:
        # A consumer that stops polling for max_poll_interval_ms leaves the group, and its
        # partitions (and leases) go to someone else: poll while paused, but only as often as
        # that needs. A poll of a paused partition throws away what the fetcher had already read
        # of it, to be read again from the broker on resume.
        self.consumer.pause(*self.consumer.assignment())
        if time.monotonic() - self._last_poll < self._poll_at_least_every_s:
            return {}
        return await self._poll(timeout_ms=0, max_records=1)

    async def _poll(self, *, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        batches: dict[TopicPartition, list[Any]] = await self.outages.call(
            lambda: self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records))
        self._last_poll = time.monotonic()
        return batches

    def _tickets(self, batches: dict[TopicPartition, list[Any]]) -> list[Taken]:
        assigned = self.consumer.assignment()
        return [Taken(self.tracker.started(tp, record.offset), record)
                for tp, records in batches.items() if tp in assigned  # else revoked since: the new owner reads them
                for record in records]

    # --- dead letters and sends ----------------------------------------------------------------

    async def dead_letter(self, letters: Sequence[tuple[Taken | None, Letter]]) -> None:
        """Send dead letters, each with the record it stands for (None: not a record of this
        loop's topic), and wait for the broker's acknowledgements; only then are the records
        finished."""
        if not letters:
            return
        for taken, letter in letters:
            self._events.dead_lettered(letter.reason)
            where = {} if taken is None else {"topic": taken.record.topic, "partition": taken.record.partition,
                                              "offset": taken.record.offset}
            log.warning("dead-lettered a record", loop=self.name, reason=letter.reason, error=letter.error[:300],
                        **where)
        await self.send([Record(self.dlq_topic, letter.kafka_key, letter.to_json()) for _, letter in letters])
        for taken, _ in letters:
            if taken is not None:
                taken.ticket.finished(taken.record.offset)
        self.freed()

    async def send(self, records: Sequence[Record]) -> None:
        """Publish ``records`` and wait for every acknowledgement (``consumers.sender``), riding
        out a broker outage: a repeated send is safe (ids are deterministic, consumers dedupe)."""
        if records:
            await self.outages.call(lambda: send_records(self._producer, records))

    # --- offsets -------------------------------------------------------------------------------

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        """Commit, per partition, the offset below which every record is finished."""
        moves = await self._committer.commit(only)
        if not moves:
            return
        self.last_commit_advance = time.monotonic()
        for tp, offset in moves.items():
            self._events.committed(tp.topic, tp.partition, offset)

    async def _commit_on_tick(self) -> None:
        """The one rule for a failed commit (see the module's docstring)."""
        try:
            await self.commit()
        except KafkaError as exc:  # a rebalance under way, or the broker away: the next tick commits again
            log.warning("commit failed; retrying on the next tick", loop=self.name, error=repr(exc))
            now = time.monotonic()
            self._commit_failing_since = self._commit_failing_since or now
            lasted = now - self._commit_failing_since
            if lasted > self.outages.tolerance_s:
                raise OutageTooLong(f"offsets could not be committed for {lasted:.0f}s, past the tolerance of "
                                    f"{self.outages.tolerance_s:g}s: {exc!r}") from exc
        else:
            self._commit_failing_since = None

    def lag(self) -> dict[TopicPartition, int]:
        """Records behind the end of each assigned partition, from the oldest unfinished offset."""
        behind = {}
        for tp in self.consumer.assignment():
            highwater = self.consumer.highwater(tp)
            position = self.tracker.committable(tp)
            if highwater is not None and position is not None:
                behind[tp] = max(0, highwater - position)
        return behind
