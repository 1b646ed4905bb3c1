"""Every client this process opens to Redis and Kafka, built here with the same options, so that
a timeout, a delivery guarantee or an address is decided once for the worker, the API and the CLI.

- Redis: every command and connection attempt gives up after ``SGW_REDIS_TIMEOUT_S`` (a hung
  server is an outage the callers see, never a request that waits forever). With
  ``SGW_REDIS_CLUSTER`` the client is a Redis Cluster's: it learns the slots from the node the URL
  names, and after a failover from whichever node answers.
- Kafka producers: idempotent with ``acks=all``, so a record is written once, and only when
  every in-sync replica has it; batching from ``SGW_PRODUCER_LINGER_MS`` and
  ``SGW_PRODUCER_BATCH_BYTES``.
- Kafka consumers: offsets are committed by the loops themselves (at-least-once, after the work
  is done), never automatically; a group with no committed offset starts from the earliest.
"""

from __future__ import annotations

from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from scoring.stores.client import RedisClient
from worker.settings import Settings


def redis_client(settings: Settings) -> RedisClient:
    if settings.redis_cluster:
        return RedisCluster.from_url(settings.redis_url, socket_timeout=settings.redis_timeout_s,
                                     socket_connect_timeout=settings.redis_timeout_s)
    return Redis.from_url(settings.redis_url, socket_timeout=settings.redis_timeout_s,
                          socket_connect_timeout=settings.redis_timeout_s)


def kafka_producer(settings: Settings, **options: Any) -> AIOKafkaProducer:
    """``options``: what one producer needs beyond the common ones (``max_request_size``)."""
    return AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, enable_idempotence=True, acks="all",
                            linger_ms=settings.producer_linger_ms, max_batch_size=settings.producer_batch_bytes,
                            **options)


def kafka_consumer(settings: Settings, group_id: str | None, **options: Any) -> AIOKafkaConsumer:
    """``group_id`` None reads without a group (every partition, nothing committed)."""
    return AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=group_id,
                            enable_auto_commit=False, auto_offset_reset="earliest", **options)


def kafka_admin(settings: Settings) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
