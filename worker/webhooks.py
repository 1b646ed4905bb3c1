"""The webhook sender's wiring and metrics, and ``scorer-worker webhooks replay``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from adapters.egress import EgressPolicy
from adapters.stores.catalog import CatalogStore
from adapters.stores.channels import disable_channel
from adapters.stores.client import RedisClient
from adapters.stores.deliveries import DeliverySchedule
from consumers.outage import OutageGuard
from consumers.range_reads import read_to_end
from consumers.webhook_lanes import SenderLimits
from consumers.webhooks import WebhookSender
from scoring.catalog import CatalogSnapshot
from scoring.models import AlertChannel
from scoring.results import WebhookDelivery, channel_key
from scoring.webhooks import payloads
from scoring.webhooks.payloads import LinkTemplate
from scoring.webhooks.retries import parse_duration
from worker.connections import kafka_consumer, kafka_producer, redis_client
from worker.metrics import PrometheusWebhookEvents
from worker.settings import Settings


def sender_limits(s: Settings) -> SenderLimits:
    return SenderLimits(timeout_s=s.webhook_timeout_s, channel_concurrency=s.webhook_channel_concurrency,
                        breaker_failures=s.webhook_breaker_failures, breaker_open_s=s.webhook_breaker_open_s,
                        disable_after_s=s.webhook_disable_after_s)


def delivery_schedule(s: Settings, redis: RedisClient) -> DeliverySchedule:
    return DeliverySchedule(redis, lease_s=sender_limits(s).lease_s, schedule=s.webhook_retry())


def webhook_sender(s: Settings, redis: RedisClient, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer,
                   catalog: Any, outages: OutageGuard) -> WebhookSender:
    """The sender of a worker: ``catalog`` gives the current CatalogSnapshot."""
    store = CatalogStore(redis)

    async def disable(channel_id: str, reason: str) -> bool:
        return await disable_channel(store, channel_id, reason)

    def current() -> CatalogSnapshot:
        snapshot: CatalogSnapshot = catalog()
        return snapshot

    return WebhookSender(consumer=consumer, producer=producer, dlq_topic=s.webhooks_dlq_topic, catalog=current,
                         schedule=delivery_schedule(s, redis), retry=s.webhook_retry(),
                         egress=EgressPolicy.parse(s.egress_allow_list()), disable=disable,
                         limits=sender_limits(s), events=PrometheusWebhookEvents(), body=payload_builder(s),
                         outages=outages)


def payload_builder(s: Settings) -> Callable[[AlertChannel, WebhookDelivery], bytes]:
    links = LinkTemplate(s.webhook_link_template)
    return lambda channel, delivery: payloads.body(channel, delivery, links)


# --- scorer-worker webhooks replay ----------------------------------------------------------------

def parse_since(text: str, now: datetime | None = None) -> datetime:
    """An ISO time ('2026-12-02T13:00:00Z') or a duration back from now ('2h', '3d')."""
    try:
        return (now or datetime.now(UTC)) - timedelta(seconds=parse_duration(text))
    except ValueError:
        pass
    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def matches(delivery: WebhookDelivery, channel: str | None) -> bool:
    """``--channel`` names an agent (all its channels), a URL, or ``agent|url``."""
    if channel is None or channel == delivery.agent_id:
        return True
    agent, _, url = channel.rpartition("|") if "|" in channel else ("", "", channel)
    same_url = url == delivery.url or (bool(delivery.channel) and channel_key(url) == delivery.channel)
    return same_url and agent in ("", delivery.agent_id)


async def dead_letters(s: Settings) -> list[dict[str, Any]]:
    """Everything on the webhooks dead-letter topic now (in order within a partition)."""
    records = await read_to_end(lambda: kafka_consumer(s, None), s.webhooks_dlq_topic)
    return [orjson.loads(r.value) for r in records if r.value]


async def replay(s: Settings, *, channel: str | None, since: datetime | None, out: TextIO = sys.stdout) -> int:
    """Send dead-lettered deliveries again: each goes back on the webhooks topic under its own
    id (receivers that saw it dedupe), with its dead mark in Redis lifted. Returns how many."""
    chosen: dict[str, WebhookDelivery] = {}
    for letter in await dead_letters(s):
        if not isinstance(letter.get("delivery"), dict):
            continue  # an invalid record: nothing to send
        failed_at = datetime.fromisoformat(str(letter.get("failedAt")))
        delivery = WebhookDelivery.model_validate(letter["delivery"])
        if (since is None or failed_at >= since) and matches(delivery, channel):
            chosen[delivery.id] = delivery
    if not chosen:
        print("no dead letters match", file=out)
        return 0
    redis = redis_client(s)
    producer = kafka_producer(s)
    await producer.start()
    try:
        await delivery_schedule(s, redis).forget_dead(list(chosen.values()))
        acks = [await producer.send(s.webhooks_topic, key=d.agent_id.encode(), value=d.to_json())
                for d in chosen.values()]
        for ack in acks:
            await ack
    finally:
        await producer.stop()
        await redis.aclose()
    for d in chosen.values():
        print(f"replayed {d.id} to agent {d.agent_id} (signal {d.signal_id})", file=out)
    print(f"{len(chosen)} replayed at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", file=out)
    return len(chosen)
