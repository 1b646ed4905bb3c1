"""A backfill's plan: the range of the traces topic its window covers, per partition, found by record time.

Offsets-for-times, the broker's index: one request per bound. The one rule: the range ends no later than
the live consumer group's committed offsets - what live scoring has not done yet is live scoring's.
The bounds: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition


@dataclass(frozen=True)
class PartitionRange:
    partition: int
    start: int  # the first offset read
    end: int  # the first offset not read


@dataclass(frozen=True)
class Plan:
    ranges: tuple[PartitionRange, ...]
    notes: tuple[str, ...] = ()

    @property
    def records(self) -> int:
        return sum(r.end - r.start for r in self.ranges)


LATE_S = 3600  # how far past ``to`` a range reads, for records stamped out of order


async def plan_ranges(consumer: AIOKafkaConsumer, topic: str, from_ms: int, to_ms: int,
                      live_done: dict[int, int] | None = None) -> Plan:
    """The offsets of ``[from_ms, to_ms)`` in every partition of ``topic``; ``live_done``: the
    live group's committed offset per partition (no later end than these)."""
    from_ms, to_ms = max(0, from_ms), max(0, to_ms)  # a window before 1970 starts at the topic's first record
    partitions = sorted(consumer.partitions_for_topic(topic) or await _partitions(consumer, topic))
    tps = [TopicPartition(topic, p) for p in partitions]
    first = await consumer.beginning_offsets(tps)
    last = await consumer.end_offsets(tps)
    starts = await consumer.offsets_for_times({tp: from_ms for tp in tps})
    ends = await consumer.offsets_for_times({tp: to_ms + LATE_S * 1000 for tp in tps})
    ranges, notes = [], []
    for tp in tps:
        start = starts[tp].offset if starts[tp] is not None else last[tp]
        end = ends[tp].offset if ends[tp] is not None else last[tp]
        if live_done is not None and tp.partition in live_done and live_done[tp.partition] < end:
            end = live_done[tp.partition]
            # Notes are the tenant's to read: no offset of the shared topic (its traffic is others' too).
            notes.append(f"partition {tp.partition}: read up to where live scoring has reached; "
                         "what comes after is live scoring's")
        if start == first[tp] and first[tp] > 0 and starts[tp] is not None and starts[tp].timestamp > from_ms:
            notes.append(f"partition {tp.partition}: the window starts before the topic's retention; read from "
                         "the earliest record still there")
        ranges.append(PartitionRange(tp.partition, start, max(start, end)))
    return Plan(tuple(ranges), tuple(notes))


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()
    return consumer.partitions_for_topic(topic) or set()
