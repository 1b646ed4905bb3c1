"""OpenTelemetry in: the Collector's Kafka exporter output, assembled into traces.

Two loops share a Redis assembly buffer (``scoring.stores.otlp_buffer``):

The **span loop**, per batch of records:

1. fetch a batch (``getmany``);
2. decode every record (``otlp_proto`` or ``otlp_json``) and map its spans
   (``scoring.otlp.mapping``); a record that is not OTLP, or whose spans lack a project or valid ids,
   goes to the dead-letter topic with the reason (its other spans are still buffered);
3. buffer the spans: one pipelined Redis round trip; when the buffer is over its total bound,
   pause, wait for the flush loop to make room, and try again (nothing is dropped); a record
   whose project is over its own share is dead-lettered (``over_quota``), so one tenant never
   holds up the others;
4. only then are the batch's offsets committable (committed on a timer): a crash before step 3
   redelivers the records, and buffering them again changes nothing.

The **flush loop**, every ``flush_interval_s``: claim the due traces (atomically, under a lease),
assemble each into a ``Trace``, publish it to the traces topic keyed by its trace id, and once
the broker acknowledged, forget it in the buffer. A worker that dies between publish and finish
lets the lease expire and another publishes the same trace id again; the traces pipeline's
dedupe absorbs it. From the traces topic on, the trace is scored like any other (sampling,
budget, dedupe).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, Protocol, get_args

import orjson
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from consumers.decode import DeadLetter, DeadLetterReason, dead_letter
from consumers.offsets import Committer
from consumers.outage import OutageGuard
from scoring.otlp.mapping import (
    BufferedSpan,
    MappingRules,
    OtlpError,
    Rejected,
    assemble,
    buffered_spans,
    decode_request,
)
from scoring.stores.otlp_buffer import BufferSize, DueTrace, OtlpBuffer, member_of

log = structlog.get_logger(__name__)



class OtlpEvents(Protocol):
    """What the OTLP loops report (``worker.metrics.PrometheusOtlpEvents``)."""

    def spans_consumed(self, count: int) -> None: ...
    def spans_late(self, count: int) -> None: ...
    def spans_dropped(self, count: int) -> None: ...
    def dead_lettered(self, reason: str) -> None: ...
    def assembled(self, complete: bool, delay_s: float) -> None: ...
    def buffer_size(self, size: BufferSize) -> None: ...
    def partitions_assigned(self, count: int) -> None: ...


class NoOtlpEvents:
    def spans_consumed(self, count: int) -> None: ...
    def spans_late(self, count: int) -> None: ...
    def spans_dropped(self, count: int) -> None: ...
    def dead_lettered(self, reason: str) -> None: ...
    def assembled(self, complete: bool, delay_s: float) -> None: ...
    def buffer_size(self, size: BufferSize) -> None: ...
    def partitions_assigned(self, count: int) -> None: ...


class OtlpConsumer:
    def __init__(self, *, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, buffer: OtlpBuffer,
                 rules: MappingRules, traces_topic: str, dlq_topic: str, events: OtlpEvents | None = None,
                 encoding: str = "auto", max_record_bytes: int = 8 << 20, max_dead_letter_bytes: int = 3 << 20,
                 commit_interval_s: float = 1.0, flush_interval_s: float = 0.5, full_retry_s: float = 0.5,
                 outages: OutageGuard | None = None) -> None:
        self._consumer = consumer
        self._producer = producer
        self._buffer = buffer
        self._rules = rules
        self._traces_topic = traces_topic
        self._dlq_topic = dlq_topic
        self._events: OtlpEvents = events or NoOtlpEvents()
        self._encoding = encoding
        self._max_record_bytes = max_record_bytes
        self._max_dead_letter_bytes = max_dead_letter_bytes
        self._flush_interval_s = flush_interval_s
        self._full_retry_s = full_retry_s
        # Redis or the broker unreachable for a while: every step below is safe to repeat
        # (buffering is idempotent, claims expire, emitted traces keep their ids), so it waits.
        self._outages = outages or OutageGuard(tolerance_s=120.0)
        self._flushing: asyncio.Task[None] | None = None
        # A batch's records are finished together, once buffered: its offsets advance at once.
        self._committer = Committer(consumer, commit_interval_s)

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        return self._committer.listener(self._on_revoke,
                                        lambda assigned: self._events.partitions_assigned(len(assigned)))

    async def _on_revoke(self, revoked: set[TopicPartition]) -> None:
        try:
            await self.commit(only=revoked)
        finally:
            self._events.partitions_assigned(0)

    async def run(self, stop: asyncio.Event) -> None:
        """Both loops until ``stop``; a failure of either (Redis or Kafka gone) ends both."""
        self._flushing = flushing = asyncio.create_task(self._flush_loop(stop), name="otlp-flush")
        try:
            while not stop.is_set():
                if flushing.done():
                    break
                await self._step(stop)
        finally:
            if not flushing.done():
                await asyncio.wait([flushing], timeout=self._flush_interval_s * 4 + 5)
            flushing.cancel()
            try:
                await self.commit()
            except KafkaError as exc:
                log.warning("final OTLP commit failed; the records are redelivered", error=repr(exc))
        if flushing.done() and not flushing.cancelled() and flushing.exception() is not None:
            raise flushing.exception()  # type: ignore[misc]

    # --- the span loop -------------------------------------------------------------------------

    async def _step(self, stop: asyncio.Event) -> None:
        batches = await self._consumer.getmany(timeout_ms=200, max_records=1000)
        assigned = self._consumer.assignment()
        decoded: list[tuple[TopicPartition, Any, list[BufferedSpan], DeadLetter | None]] = []
        ends: dict[TopicPartition, int] = {}
        for tp, records in batches.items():
            if tp not in assigned:
                continue  # revoked since the fetch: the new owner reads these records
            for record in records:
                decoded.append((tp, record, *self._decode(tp, record)))
                ends[tp] = record.offset + 1
        if ends:
            spans = [span for _, _, taken, _ in decoded for span in taken]
            self._events.spans_consumed(len(spans))
            refused = await self._buffer_all(spans, stop)
            if refused is None:
                return  # stopped while the buffer was full: the records are redelivered
            await self._dead_letter([letter for letter in (self._over_quota(d, refused) for d in decoded) if letter])
            held = self._consumer.assignment()
            for tp, next_offset in ends.items():
                if tp in held:  # revoked while buffering: forgotten, the new owner commits it
                    self._committer.tracker.advance(tp, next_offset)
        if self._committer.due:
            try:
                await self.commit()
            except KafkaError as exc:
                log.warning("OTLP commit failed; retrying on the next tick", error=repr(exc))

    def _decode(self, tp: TopicPartition, record: Any) -> tuple[list[BufferedSpan], DeadLetter | None]:
        """A record's spans and, if any of it could not be taken, its dead letter. Never raises:
        whatever a tenant sends ends up buffered or dead-lettered with the reason."""
        value: bytes | None = record.value
        try:
            if value is None:
                raise OtlpError("not_otlp", "the record has no value (a tombstone)")
            if len(value) > self._max_record_bytes:
                raise OtlpError("too_large", f"the record is {len(value)} bytes, over the limit of "
                                             f"{self._max_record_bytes}")
            taken, rejected = buffered_spans(decode_request(value, self._encoding), self._rules)
        except OtlpError as exc:
            return [], self._letter(tp, record, exc.reason, str(exc))
        except Exception as exc:  # a malformed record must never stop the loop
            return [], self._letter(tp, record, "not_otlp", f"could not read the record: {exc!r}"[:1000])
        if not taken and not rejected:  # valid protobuf of no spans: foreign bytes, never the exporter's
            return [], self._letter(tp, record, "not_otlp", "the record holds no spans")
        if not rejected:
            return taken, None
        return taken, self._letter(tp, record, rejected[0].reason, _rejection_summary(rejected, len(taken)))

    def _over_quota(self, decoded: tuple[TopicPartition, Any, list[BufferedSpan], DeadLetter | None],
                    refused: frozenset[str]) -> DeadLetter | None:
        """A record's dead letter: its own, or - when its project is over its share of the buffer
        and spans of it were refused - one saying so (replaying it later loses nothing)."""
        tp, record, taken, letter = decoded
        over = sorted({member_of(s) for s in taken} & refused)
        if not over:
            return letter
        error = (f"project {over[0].rsplit('/', 1)[0]!r} is over its share of the assembly buffer "
                 f"(SGW_OTLP_MAX_PROJECT_BYTES); {len(over)} trace(s) of this record were not buffered")
        if letter is not None:
            return letter.model_copy(update={"error": f"{letter.error}; {error}"})
        return self._letter(tp, record, "over_quota", error)

    async def _buffer_all(self, spans: list[BufferedSpan], stop: asyncio.Event) -> frozenset[str] | None:
        """Buffer ``spans``, waiting while the buffer is full; the members refused for their
        project's share, or None when stopped before the spans were buffered."""
        while True:
            result = await self._outages.call(lambda: self._buffer.add(spans))
            if result.late:
                self._events.spans_late(result.late)
            if result.dropped:
                self._events.spans_dropped(result.dropped)
                log.warning("spans dropped over a trace's bounds", spans=result.dropped)
            if not result.full:
                return result.refused
            # Over the total bound: hold these offsets (and the partitions) until traces leave.
            # Storing again what was stored changes nothing, so the whole batch is retried.
            log.warning("OTLP buffer full; pausing span intake until traces are emitted")
            self._consumer.pause(*self._consumer.assignment())
            await asyncio.sleep(self._full_retry_s)
            await self._consumer.getmany(timeout_ms=0, max_records=1)  # keep polling while paused
            if stop.is_set():
                return None
            if self._flushing is not None and self._flushing.done():
                raise RuntimeError("the OTLP flush loop ended while the buffer was full")
            self._consumer.resume(*self._consumer.paused())

    def _letter(self, tp: TopicPartition, record: Any, reason: str, error: str) -> DeadLetter:
        known: DeadLetterReason = reason if reason in get_args(DeadLetterReason) else "not_otlp"  # type: ignore[assignment]
        return dead_letter(known, error, tp.topic, tp.partition, record.offset, record.key, record.value,
                           self._max_dead_letter_bytes)

    async def _dead_letter(self, letters: list[DeadLetter]) -> None:
        for letter in letters:
            self._events.dead_lettered(letter.reason)
            log.warning("dead-lettered an OTLP record", reason=letter.reason, error=letter.error[:300],
                        topic=letter.topic, partition=letter.partition, offset=letter.offset)
        messages = [(self._dlq_topic, letter.key.encode() if letter.key else None, letter.to_json())
                    for letter in letters]
        await self._send_all(messages)

    async def _send_all(self, messages: list[tuple[str, bytes | None, bytes]]) -> None:
        """Publish and wait for every acknowledgement, riding out a broker outage."""
        async def send() -> None:
            acks = [await self._producer.send(topic, key=key, value=value) for topic, key, value in messages]
            await asyncio.gather(*acks)

        if messages:
            await self._outages.call(send)

    async def commit(self, only: set[TopicPartition] | None = None) -> None:
        await self._committer.commit(only)

    # --- the flush loop ------------------------------------------------------------------------

    async def _flush_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            due = await self._outages.call(self._buffer.claim_due)
            self._events.buffer_size(self._buffer.size)
            if due:
                await self._emit(due)
            else:
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self._flush_interval_s)
                except TimeoutError:
                    pass

    async def _emit(self, due: list[DueTrace]) -> None:
        messages: list[tuple[str, bytes | None, bytes]] = []
        emitted: list[tuple[DueTrace, bool]] = []
        for trace in due:
            if not trace.spans:
                continue  # its spans ran out their TTL: nothing left to score
            try:
                assembled = assemble(trace.spans, partial=not trace.complete,
                                     assembly="quiet" if trace.complete else "max_wait",
                                     dropped_spans=trace.dropped)
            except Exception as exc:  # e.g. a field the trace model refuses
                log.warning("an assembled OTLP trace is invalid; dead-lettered", trace=trace.member, error=repr(exc))
                messages.append((self._dlq_topic, trace.member.encode(), _assembly_letter(trace, exc)))
                self._events.dead_lettered("invalid_trace")
                continue
            messages.append((self._traces_topic, assembled.trace_id.encode(),
                             assembled.model_dump_json(by_alias=True, exclude_none=True).encode()))
            emitted.append((trace, trace.complete))
        await self._send_all(messages)  # acknowledged by the broker before the buffer forgets them
        late = await self._outages.call(lambda: self._buffer.finish(due))
        if late:
            self._events.spans_late(late)
        now = time.time()
        for trace, complete in emitted:
            self._events.assembled(complete, max(0.0, now - trace.last_seen))


def _rejection_summary(rejected: list[Rejected], taken: int) -> str:
    traces = sorted({r.trace_id for r in rejected})
    shown = ", ".join(traces[:5]) + (f" and {len(traces) - 5} more" if len(traces) > 5 else "")
    return (f"{rejected[0].error} ({len(rejected)} span(s) of trace(s) {shown} not taken; "
            f"{taken} other span(s) of this record were buffered)")


def _assembly_letter(trace: DueTrace, exc: Exception) -> bytes:
    return orjson.dumps({"reason": "invalid_trace", "error": str(exc)[:2000], "member": trace.member,
                         "spans": [s.model_dump(mode="json", by_alias=True) for s in trace.spans],
                         "receivedAt": datetime.now(UTC).isoformat()})
