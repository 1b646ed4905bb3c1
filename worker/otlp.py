"""The OpenTelemetry intake as one task of the worker: its consumer (a group of its own, so span
partitions are shared among workers independently of the traces'), the Redis buffer and the
loops of ``consumers.otlp``, built from the settings."""

from __future__ import annotations

import asyncio

import structlog
from aiokafka import AIOKafkaProducer

from adapters.stores.client import RedisClient
from adapters.stores.otlp_buffer import OtlpBuffer
from consumers.otlp import OtlpConsumer
from consumers.outage import OutageGuard
from scoring.otlp.mapping import MappingRules
from worker import metrics
from worker.connections import kafka_consumer
from worker.settings import Settings

log = structlog.get_logger(__name__)

RECORD_HEADROOM = 4096  # bytes an assembled trace adds around its spans' JSON


def otlp_intake(settings: Settings, redis: RedisClient, producer: AIOKafkaProducer,
                outages: OutageGuard) -> OtlpConsumer:
    """The intake of a worker, subscribed and not started: ``run_otlp_intake`` runs it."""
    s = settings
    consumer = kafka_consumer(
        s, f"{s.consumer_group}-otlp", max_partition_fetch_bytes=max(s.max_trace_bytes * 2, 8 << 20),
        client_id=f"scorer-group-worker-{s.consumer_group}-otlp")
    buffer = OtlpBuffer(redis, quiet_s=s.otlp_quiet_s, max_wait_s=s.otlp_max_wait_s, lease_s=s.otlp_claim_lease_s,
                        max_spans=s.otlp_max_spans_per_trace, max_trace_bytes=s.max_trace_bytes - RECORD_HEADROOM,
                        max_total_bytes=s.otlp_max_buffer_bytes, max_project_bytes=s.otlp_max_project_bytes,
                        ttl_s=s.otlp_buffer_ttl_s,
                        done_ttl_s=s.otlp_late_window_s)
    rules = MappingRules(project_attribute=s.otlp_project_attribute, default_project=s.otlp_default_project,
                         session_attribute=s.otlp_session_attribute)
    intake = OtlpConsumer(consumer=consumer, producer=producer, buffer=buffer, rules=rules,
                          traces_topic=s.traces_topic, dlq_topic=s.dlq_topic, events=metrics.PrometheusOtlpEvents(),
                          encoding=s.otlp_encoding, max_dead_letter_bytes=3 * s.max_trace_bytes,
                          commit_interval_s=s.commit_interval_s, flush_interval_s=s.otlp_flush_interval_s,
                          outages=outages)
    consumer.subscribe([s.otlp_topic], listener=intake.rebalance_listener())
    return intake


async def run_otlp_intake(intake: OtlpConsumer, settings: Settings, stop: asyncio.Event) -> None:
    s = settings
    consumer = intake.loop.consumer
    await consumer.start()
    log.info("OTLP intake started", topic=s.otlp_topic, quiet_s=s.otlp_quiet_s, max_wait_s=s.otlp_max_wait_s)
    try:
        await intake.run(stop)
    finally:
        await consumer.stop()
