"""The webhook sender waits out a Redis outage at ingest: the batch is scheduled once Redis
answers again, and only then does its offset become committable (nothing is lost, the worker
does not stop)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from redis.asyncio import Redis

from adapters.egress import EgressPolicy
from adapters.stores import keys
from adapters.stores.deliveries import DeliverySchedule, shard_of
from consumers.loop import Taken
from consumers.outage import OutageGuard
from consumers.webhooks import WebhookSender
from devtools.redis_servers import LocalRedis
from scoring.catalog import CatalogSnapshot
from scoring.results import Signal, build_deliveries
from scoring.webhooks.retries import RetrySchedule

pytestmark = pytest.mark.integration


@pytest.fixture
async def own_redis_client(own_redis: LocalRedis) -> AsyncIterator[Redis]:
    """A client of the test's own server (``own_redis``) that gives up on it within 0.3 s."""
    client = Redis.from_url(own_redis.url, socket_timeout=0.3, socket_connect_timeout=0.3)
    try:
        yield client
    finally:
        await client.aclose()


async def test_ingest_waits_for_a_frozen_redis_then_schedules_and_frees_the_offset(
        own_redis: LocalRedis, own_redis_client: Redis) -> None:
    async def never_disabled(_id: str, _reason: str) -> bool:
        return False

    retry = RetrySchedule.parse("5s")
    guard = OutageGuard(tolerance_s=30)
    sender = WebhookSender(consumer=None, producer=None, dlq_topic="unused",  # type: ignore[arg-type]
                           catalog=CatalogSnapshot, schedule=DeliverySchedule(own_redis_client, lease_s=60, schedule=retry),
                           retry=retry, egress=EgressPolicy(), disable=never_disabled, outages=guard)
    signal_ = Signal(id="s-1", key="scorer-group:g", group_id="g", group_name="G", project_id="p", agent_id="a",
                     scope="trace", trace_id="t-1", rating=1.0, alert_threshold=5.0, severity="low",
                     justification="j", rating_id="r-1", raised_at=datetime.now(UTC))
    delivery = build_deliveries(signal_, ["https://hooks.example.com/x"])[0]
    tp = TopicPartition("webhooks", 0)
    record = ConsumerRecord(topic=tp.topic, partition=0, offset=41, timestamp=0, timestamp_type=0, key=None,
                            value=delivery.to_json(), checksum=None, serialized_key_size=0,
                            serialized_value_size=0, headers=())
    assert own_redis.proc is not None
    os.kill(own_redis.proc.pid, signal.SIGSTOP)
    ingest = asyncio.create_task(sender.take([Taken(sender.loop.tracker.started(tp, record.offset), record)]))
    await asyncio.sleep(1.5)
    assert not ingest.done() and guard.reason is not None and "redis unreachable" in guard.reason
    assert sender.loop.tracker.to_commit() == {tp: 41}, "the record is not committed while it is not in Redis"
    os.kill(own_redis.proc.pid, signal.SIGCONT)
    await asyncio.wait_for(ingest, timeout=15)

    assert guard.reason is None
    shard = shard_of(delivery)
    assert await own_redis_client.exists(keys.webhook_pending(shard, delivery.id), keys.webhook_done(shard, delivery.id))
    assert sender.loop.tracker.to_commit() == {tp: 42}, "the offset moves once the delivery is durable"
    await asyncio.gather(*sender._tasks, return_exceptions=True)
