"""Outputs are handed to the producer in bulk: on the real broker, every record arrives once, on
the partition a plain ``send`` would have chosen, in the order it was given within its partition
- whether its partition got a few records (plain sends) or many (whole producer batches)."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.partitioner import DefaultPartitioner

from consumers.events import Silent
from consumers.outputs import BULK_RECORDS, Outputs, TopicNames

pytestmark = pytest.mark.integration

PARTITIONS = 3


async def test_bulk_and_single_records_land_where_send_would_put_them_in_order(
        kafka_bootstrap: str, unique: str) -> None:
    topic = f"outputs-{unique}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    finally:
        await admin.close()
    # Many records under one key (one partition: the batch path, past one producer batch of
    # 16 KiB) and a few under others (plain sends).
    bulk = [(topic, b"busy-key", f"bulk-{i}".encode() * 200) for i in range(BULK_RECORDS * 10)]
    few = [(topic, f"key-{i}".encode(), f"few-{i}".encode()) for i in range(5)]
    records = [r for pair in zip(bulk, few + [None] * len(bulk), strict=False) for r in pair if r is not None]
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        names = TopicNames(traces=topic, ratings=topic, signals=topic, webhooks=topic, dlq=topic)
        await Outputs(producer, names, Silent()).send(records)
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False)
    await consumer.start()
    seen = []
    try:
        while len(seen) < len(records):
            for batch in (await consumer.getmany(timeout_ms=2000)).values():
                seen += batch
            assert len(seen) <= len(records)
    finally:
        await consumer.stop()
    expected_partition = {key: DefaultPartitioner()(key, list(range(PARTITIONS)), list(range(PARTITIONS)))
                          for _, key, _ in records}
    assert all(r.partition == expected_partition[r.key] for r in seen)
    for partition in range(PARTITIONS):
        got = [r.value for r in sorted(seen, key=lambda r: r.offset) if r.partition == partition]
        given = [value for _, key, value in records if expected_partition[key] == partition]
        assert got == given, f"partition {partition}: every record once, in the order given"
