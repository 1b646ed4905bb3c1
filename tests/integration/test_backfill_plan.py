"""A backfill's plan on the real broker: the range of offsets a window covers, per partition, by
record timestamp (offsets-for-times), an hour past its end, never past live scoring's offsets."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from consumers.backfill_plan import PartitionRange, plan_ranges

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
DAY_START_MS = 1_796_000_000_000  # a past day's start (2026-11-29)


async def test_the_plan_covers_exactly_the_windows_records_in_every_partition(kafka_bootstrap: str, unique: str) -> None:
    topic = f"plan-{unique}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    try:  # partition 0: one record an hour over 24 hours; partition 1: none before hour 20
        sends = [await producer.send(topic, b"x", partition=0, timestamp_ms=DAY_START_MS + h * HOUR_MS)
                 for h in range(24)]
        sends += [await producer.send(topic, b"y", partition=1, timestamp_ms=DAY_START_MS + h * HOUR_MS)
                  for h in range(20, 24)]
        await asyncio.gather(*sends)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None)
    await consumer.start()
    try:
        plan = await plan_ranges(consumer, topic, DAY_START_MS + 6 * HOUR_MS, DAY_START_MS + 21 * HOUR_MS)
        behind_live = await plan_ranges(consumer, topic, DAY_START_MS + 6 * HOUR_MS, DAY_START_MS + 21 * HOUR_MS,
                                        live_done={0: 10})
        everything = await plan_ranges(consumer, topic, 0, DAY_START_MS + 48 * HOUR_MS)
        none = await plan_ranges(consumer, topic, DAY_START_MS + 30 * HOUR_MS, DAY_START_MS + 31 * HOUR_MS)
    finally:
        await consumer.stop()
    # Hours 6..21 and 20..21: the window, and the hour after it (records out of time order; the
    # reader keeps those stamped within the window).
    assert plan.ranges == (PartitionRange(0, 6, 22), PartitionRange(1, 0, 2))
    assert plan.records == 18 and plan.notes == ()
    assert behind_live.ranges == (PartitionRange(0, 6, 10), PartitionRange(1, 0, 2)), "no further than live"
    assert "live scoring" in behind_live.notes[0]
    # A tenant reads the notes: no offset of the shared topic (its size is every project's traffic).
    assert "offset" not in behind_live.notes[0] and "10" not in behind_live.notes[0], behind_live.notes
    assert everything.ranges == (PartitionRange(0, 0, 24), PartitionRange(1, 0, 4))
    assert none.records == 0, "a window past the last record reads nothing"
