"""The one path to the producer: records sent without waiting for each, then every
acknowledgement awaited together (``send_records``). The trace loop's results
(``consumers.outputs``), its dead letters and every other loop's records (``consumers.loop``)
go this way.

1. each record's partition, as the producer would choose it (murmur2 of the key), so a trace's
   ratings, Signals and deliveries land where a plain ``send`` would have put them;
2. a partition with many records (``BULK_RECORDS``) gets them as whole producer batches, each
   handed over at once; a partition with few gets plain sends, which join the producer's open
   batch (a whole batch waits for the one before it to leave: right for bulk, slow for one);
3. every acknowledgement awaited together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from scoring.outbox import Record

_partition_of = DefaultPartitioner()

# From this many records for one partition in one send, they go as whole producer batches.
BULK_RECORDS = 16


async def send_records(producer: AIOKafkaProducer, records: Sequence[Record]) -> None:
    """Send ``records`` (the steps above) and wait until the broker has acknowledged all of them."""
    partitions: dict[str, list[int]] = {}
    for topic in {record.topic for record in records}:
        partitions[topic] = sorted(await producer.partitions_for(topic))
    by_partition: dict[tuple[str, int], list[Record]] = {}
    chosen: dict[tuple[str, bytes], tuple[str, int]] = {}  # a trace's records share a key
    for record in records:  # 1.
        topic, key = record.topic, record.key
        where = chosen.get((topic, key)) if key is not None else None
        if where is None:  # (no key: a partition of the producer's choice, for each record)
            where = (topic, _partition_of(key, partitions[topic], partitions[topic]))
            if key is not None:
                chosen[(topic, key)] = where
        by_partition.setdefault(where, []).append(record)
    acks: list[asyncio.Future[Any]] = []
    for (topic, partition), items in by_partition.items():  # 2.
        if len(items) < BULK_RECORDS:
            for r in items:
                acks.append(await producer.send(topic, key=r.key, value=r.value, partition=partition,
                                                headers=r.headers))
            continue
        batch = producer.create_batch()
        for r in items:
            if batch.append(key=r.key, value=r.value, timestamp=None, headers=r.headers or []) is None:  # full
                acks.append(await _submit(producer, batch, topic, partition))
                batch = producer.create_batch()
                batch.append(key=r.key, value=r.value, timestamp=None, headers=r.headers or [])
        acks.append(await _submit(producer, batch, topic, partition))
    await asyncio.gather(*acks)  # 3.


async def _submit(producer: AIOKafkaProducer, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
    batch.close()  # no plain ``send`` may add to it behind our back
    future: asyncio.Future[Any] = await producer.send_batch(batch, topic, partition=partition)
    return future
