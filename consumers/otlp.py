"""OpenTelemetry in: the Collector's Kafka exporter output, assembled into traces.

Two loops share a Redis assembly buffer: the span loop buffers spans, the flush loop assembles and
publishes due traces. The one rule: a record is finished only once its spans are buffered, and a trace is
forgotten only once the broker acknowledged it; a repeat is absorbed downstream. The steps:
docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any, Protocol, get_args

import orjson
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener

from adapters.stores.otlp_buffer import BufferSize, DueTrace, OtlpBuffer, member_of
from consumers.decode import DeadLetter, DeadLetterReason, dead_letter
from consumers.events import SILENT
from consumers.loop import PartitionLoop, Taken
from consumers.outage import OutageGuard
from scoring.filters import routing_headers
from scoring.otlp.mapping import (
    BufferedSpan,
    MappingRules,
    OtlpError,
    Rejected,
    assemble,
    buffered_spans,
    decode_request,
)
from scoring.outbox import Record

log = structlog.get_logger(__name__)



class OtlpEvents(Protocol):
    """What the OTLP loops report (``worker.metrics.PrometheusOtlpEvents``)."""

    def spans_consumed(self, count: int) -> None: ...
    def spans_late(self, count: int) -> None: ...
    def spans_dropped(self, count: int) -> None: ...
    def dead_lettered(self, reason: str) -> None: ...
    def committed(self, topic: str, partition: int, offset: int) -> None: ...
    def assembled(self, complete: bool, delay_s: float) -> None: ...
    def buffer_size(self, size: BufferSize) -> None: ...
    def partitions_assigned(self, count: int) -> None: ...


class OtlpConsumer:
    def __init__(self, *, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, buffer: OtlpBuffer,
                 rules: MappingRules, traces_topic: str, dlq_topic: str, events: OtlpEvents | None = None,
                 encoding: str = "auto", max_record_bytes: int = 8 << 20, max_dead_letter_bytes: int = 3 << 20,
                 commit_interval_s: float = 1.0, flush_interval_s: float = 0.5, full_retry_s: float = 0.5,
                 outages: OutageGuard | None = None) -> None:
        self._buffer = buffer
        self._rules = rules
        self._traces_topic = traces_topic
        self._events: OtlpEvents = events or SILENT
        self._encoding = encoding
        self._max_record_bytes = max_record_bytes
        self._max_dead_letter_bytes = max_dead_letter_bytes
        self._flush_interval_s = flush_interval_s
        self._full_retry_s = full_retry_s
        # Redis or the broker unreachable for a while: every step below is safe to repeat
        # (buffering is idempotent, claims expire, emitted traces keep their ids), so it waits.
        self._outages = outages or OutageGuard()
        self.loop = PartitionLoop(name="otlp", consumer=consumer, producer=producer, dlq_topic=dlq_topic,
                                  outages=self._outages, commit_interval_s=commit_interval_s, max_batch=1000,
                                  poll_timeout_ms=200, events=self._events)
        self._flushing: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        return self.loop.rebalance_listener(assigned=lambda assigned: self._events.partitions_assigned(len(assigned)),
                                            revoked=lambda _: self._events.partitions_assigned(0))

    @property
    def outage(self) -> str | None:
        return self.loop.outage

    async def run(self, stop: asyncio.Event) -> None:
        """Both loops until ``stop``; a failure of either (Redis or Kafka gone) ends both."""
        self._stop = stop
        self._flushing = flushing = asyncio.create_task(self._flush_loop(stop), name="otlp-flush")
        try:
            await self.loop.run(self, stop)
        finally:
            if not flushing.done():
                await asyncio.wait([flushing], timeout=self._flush_interval_s * 4 + 5)
            flushing.cancel()
        if flushing.done() and not flushing.cancelled() and flushing.exception() is not None:
            raise flushing.exception()  # type: ignore[misc]

    # --- the span loop: the step (consumers.loop.Step) ---------------------------------------------

    def room(self) -> int:
        return self.loop.max_batch  # a batch is buffered before the next is fetched

    def ended(self) -> bool:
        return self._flushing is not None and self._flushing.done()

    async def tick(self) -> None:
        return None

    async def take(self, batch: list[Taken]) -> None:
        decoded = [(taken, *self._decode(taken.record)) for taken in batch]
        spans = [span for _, taken_spans, _ in decoded for span in taken_spans]
        self._events.spans_consumed(len(spans))
        refused = await self._buffer_all(spans)
        if refused is None:
            return  # stopped while the buffer was full: the records are redelivered
        letters = [(taken, self._over_quota(taken.record, taken_spans, letter, refused))
                   for taken, taken_spans, letter in decoded]
        await self.loop.dead_letter([(taken, letter) for taken, letter in letters if letter is not None])
        for taken, letter in letters:
            if letter is None:
                taken.ticket.finished(taken.record.offset)

    def _decode(self, record: Any) -> tuple[list[BufferedSpan], DeadLetter | None]:
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
            return [], self._letter(record, exc.reason, str(exc))
        except Exception as exc:  # a malformed record must never stop the loop
            return [], self._letter(record, "not_otlp", f"could not read the record: {exc!r}"[:1000])
        if not taken and not rejected:  # valid protobuf of no spans: foreign bytes, never the exporter's
            return [], self._letter(record, "not_otlp", "the record holds no spans")
        if not rejected:
            return taken, None
        return taken, self._letter(record, rejected[0].reason, _rejection_summary(rejected, len(taken)))

    def _over_quota(self, record: Any, taken: list[BufferedSpan], letter: DeadLetter | None,
                    refused: frozenset[str]) -> DeadLetter | None:
        """A record's dead letter: its own, or - when its project is over its share of the buffer
        and spans of it were refused - one saying so (replaying it later loses nothing)."""
        over = sorted({member_of(s) for s in taken} & refused)
        if not over:
            return letter
        error = (f"project {over[0].rsplit('/', 1)[0]!r} is over its share of the assembly buffer "
                 f"(SGW_OTLP_MAX_PROJECT_BYTES); {len(over)} trace(s) of this record were not buffered")
        if letter is not None:
            return letter.model_copy(update={"error": f"{letter.error}; {error}"})
        return self._letter(record, "over_quota", error)

    async def _buffer_all(self, spans: list[BufferedSpan]) -> frozenset[str] | None:
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
            await self.loop.pause_for(self._full_retry_s)
            if self._stop.is_set():
                return None
            if self.ended():
                raise RuntimeError("the OTLP flush loop ended while the buffer was full")

    def _letter(self, record: Any, reason: str, error: str) -> DeadLetter:
        known: DeadLetterReason = reason if reason in get_args(DeadLetterReason) else "not_otlp"  # type: ignore[assignment]
        return dead_letter(known, error, record.topic, record.partition, record.offset, record.key, record.value,
                           self._max_dead_letter_bytes)

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
        messages: list[Record] = []
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
                messages.append(Record(self.loop.dlq_topic, trace.member.encode(), _assembly_letter(trace, exc)))
                self._events.dead_lettered("invalid_trace")
                continue
            # With its routing headers: a trace no live group wants is skipped without being parsed.
            messages.append(Record(self._traces_topic, assembled.trace_id.encode(),
                                   assembled.model_dump_json(by_alias=True, exclude_none=True).encode(),
                                   routing_headers(assembled)))
            emitted.append((trace, trace.complete))
        await self.loop.send(messages)  # acknowledged by the broker before the buffer forgets them
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
