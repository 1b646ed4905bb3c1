"""Reading a fixed range of offsets, outside any consumer group: the second of the service's two ways to read Kafka.

``consumers.loop.PartitionLoop`` consumes as a group member; a ``RangeReader`` reads one partition's
``[start, end)`` back, assigned by hand, committing nothing. The one rule: every ``getmany`` of the
service is in one of these two modules. More: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

log = structlog.get_logger(__name__)


@contextlib.asynccontextmanager
async def started(make: Callable[[], AIOKafkaConsumer]) -> AsyncIterator[AIOKafkaConsumer]:
    """A consumer of its own, started, and stopped however the block ends."""
    consumer = make()
    await consumer.start()
    try:
        yield consumer
    finally:
        await _stopped(consumer)


class RangeReader:
    """``[start, end)`` of one partition, a batch at a time, on ``consumer`` (started, and
    assigned to this partition only, by ``reading``)."""

    def __init__(self, consumer: AIOKafkaConsumer, tp: TopicPartition, end: int) -> None:
        self.consumer, self.tp, self.end = consumer, tp, end

    async def next_batch(self, max_records: int, timeout_ms: int = 1000) -> list[Any] | None:
        """The range's next records, none past its end; ``[]`` when none came within
        ``timeout_ms``; None once the range is read. Offsets without a record (transaction
        markers, records retention removed - the consumer then starts from the earliest there
        is) are passed by the position alone: the range is read once the position is at its end."""
        batch = (await self.consumer.getmany(self.tp, timeout_ms=timeout_ms,
                                             max_records=max_records)).get(self.tp, [])
        records = [r for r in batch if r.offset < self.end]
        if records:
            return records
        return None if await self.consumer.position(self.tp) >= self.end else []


@contextlib.asynccontextmanager
async def reading(make: Callable[[], AIOKafkaConsumer], tp: TopicPartition, start: int,
                  end: int) -> AsyncIterator[RangeReader]:
    """A ``RangeReader`` of ``[start, end)`` on a consumer of its own."""
    async with started(make) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, start)
        yield RangeReader(consumer, tp, end)


async def read_to_end(make: Callable[[], AIOKafkaConsumer], topic: str, max_records: int = 500) -> list[Any]:
    """Every record of ``topic`` now - each partition from its earliest record to its end at the
    time of the call - in order within a partition."""
    async with started(make) as consumer:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            await consumer._client.force_metadata_update()  # a topic this client has not asked about yet
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        firsts, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
    records: list[Any] = []
    for tp in tps:
        if firsts[tp] >= ends[tp]:
            continue
        async with reading(make, tp, firsts[tp], ends[tp]) as reader:
            while (batch := await reader.next_batch(max_records, timeout_ms=500)) is not None:
                records.extend(batch)
    return records


async def _stopped(consumer: AIOKafkaConsumer) -> None:
    """Stop a reader's consumer. aiokafka's close awaits a task it cancels, and one cancelled
    before it ever ran answers CancelledError (seen when a backfill's turn is short): that is not
    this task being cancelled, and the read ends as it would have."""
    try:
        await consumer.stop()
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise
        log.warning("a range reader's consumer stopped with aiokafka's own cancellation; ignored")
