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
from scoring.outbox import Record

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
    bulk = [Record(topic, b"busy-key", f"bulk-{i}".encode() * 200) for i in range(BULK_RECORDS * 10)]
    few = [Record(topic, f"key-{i}".encode(), f"few-{i}".encode()) for i in range(5)]
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
                          for key in {r.key for r in records}}
    assert all(r.partition == expected_partition[r.key] for r in seen)
    for partition in range(PARTITIONS):
        got = [r.value for r in sorted(seen, key=lambda r: r.offset) if r.partition == partition]
        given = [r.value for r in records if expected_partition[r.key] == partition]
        assert got == given, f"partition {partition}: every record once, in the order given"


async def test_a_backfills_policy_says_backfill_and_pages_nobody(kafka_bootstrap: str, unique: str) -> None:
    """A result below the threshold, published live, is a rating, a Signal and a
    delivery per channel; published by a backfill (without ``alerts``), it is a rating that says
    ``origin: backfill`` and nothing else."""
    import orjson

    from consumers.outputs import PublishPolicy
    from scoring.blend import MemberOutcome, blend
    from scoring.catalog import CatalogSnapshot
    from scoring.models import AlertChannel, ScorerGroup
    from scoring.panel import GroupResult
    from scoring.subjects import Trace, trace_subject

    names = {kind: f"{kind}-{unique}" for kind in ("ratings", "signals", "webhooks")}
    group = ScorerGroup.model_validate({
        "id": "g", "name": "G", "projectId": "p", "members": [{"kind": "pattern", "refId": "x", "weight": 1}],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}})
    channel = AlertChannel.model_validate({"agentId": "a", "url": "https://hooks.example.com/x", "projectId": "p"})
    snapshot = CatalogSnapshot(groups={"g": group}, channels={"c": channel})
    trace = Trace.model_validate({"traceId": "t-1", "projectId": "p", "agentId": "a",
                                  "timestamp": "2026-11-29T10:00:00Z", "spans": [{"spanId": "r", "output": "x"}]})
    poor = GroupResult(group, trace_subject(trace), blend([MemberOutcome(name="X", kind="pattern", weight=1, gate=False,
                                                                         ref_id="x", native=True, goodness=0.2)]))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        topics = TopicNames(traces="-", ratings=names["ratings"], signals=names["signals"], webhooks=names["webhooks"],
                            dlq="-")
        for name in names.values():
            await producer.partitions_for(name)  # created on first use (auto-create, one partition)
        await Outputs(producer, topics, Silent()).publish([poor], "trace", snapshot)
        await Outputs(producer, topics, Silent(), policy=PublishPolicy(origin="backfill", signals=False)).publish(
            [poor], "trace", snapshot)
    finally:
        await producer.stop()

    async def read(topic: str) -> list[dict[str, object]]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest",
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            got = await consumer.getmany(timeout_ms=3000)
            return [orjson.loads(r.value) for batch in got.values() for r in batch]
        finally:
            await consumer.stop()

    ratings = await read(names["ratings"])
    assert [r["origin"] for r in ratings] == ["live", "backfill"]
    assert len(await read(names["signals"])) == 1 and len(await read(names["webhooks"])) == 1, \
        "the live result paged; the backfilled one did not"
