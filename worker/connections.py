"""Every client this process opens to Redis and Kafka, built here with the same options.

The one rule: a timeout, a delivery guarantee or an address is decided once, here, for the worker, the
API and the CLI - Redis commands time out (``SGW_REDIS_TIMEOUT_S``), producers are idempotent with
``acks=all``, consumers never commit automatically. The options in full: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import hiredis  # noqa: F401 - the C packer's: missing, the worker says so at import, not at a first command
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.helpers import create_ssl_context
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    BlockingConnectionPool,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
    parse_url,
)
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError

from adapters.stores.client import PoolBusy, RedisClient
from worker import metrics
from worker.settings import Settings


class _CPacked(AbstractConnection):
    """A connection whose commands hiredis packs (C), with redis-py's own serializer for it (its
    synchronous client's default), where redis-py's asyncio client packs in Python: an ``encode``
    and a join per argument, 640 ns each here. A batch's claim, history and done scripts carry
    a dozen arguments per pair: packing them was 9% of a pattern-only trace's CPU (py-spy).
    The same bytes (tests/unit/test_redis_packing.py)."""

    _packer = HiredisRespSerializer()

    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder
        if encoder.encoding != "utf-8" or encoder.encoding_errors != "strict":  # hiredis writes UTF-8, strictly
            return super().pack_command(*args)
        packed: list[bytes] = self._packer.pack(*args)
        return packed


class CPackedConnection(_CPacked, Connection):
    pass


class CPackedSSLConnection(_CPacked, SSLConnection):
    pass


class CPackedUnixConnection(_CPacked, UnixDomainSocketConnection):
    pass


C_PACKED: dict[type, type] = {Connection: CPackedConnection, SSLConnection: CPackedSSLConnection,
                              UnixDomainSocketConnection: CPackedUnixConnection}


class MeteredPool(BlockingConnectionPool):
    """The bounded pool, metered: a call that finds every connection in use waits for one
    (counted, with its seconds) up to the pool's timeout, then raises ``PoolBusy`` - the process
    asked more of its pool than it holds, which is back-pressure, not the server failing (a
    plain ``ConnectionError`` here read as an outage, pausing every loop)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        metrics.meter_redis_pool(lambda: len(self._available_connections) + len(self._in_use_connections),
                                 lambda: len(self._in_use_connections), self.max_connections)

    async def get_connection(self, *args: Any, **options: Any) -> Any:
        waits = not self.can_get_connection()  # the usual case: a free connection, nothing to count
        started = time.monotonic()
        try:
            connection = await super().get_connection()  # type: ignore[no-untyped-call]
        except RedisConnectionError as exc:
            if not isinstance(exc.__cause__, asyncio.TimeoutError):  # the server's failure, as it came
                raise
            metrics.REDIS_CONNECTION_WAITS.labels("deadline").inc()
            metrics.REDIS_CONNECTION_WAIT_SECONDS.inc(time.monotonic() - started)
            raise PoolBusy(f"every one of the {self.max_connections} Redis connections stayed in use for "
                           f"{self.timeout}s (SGW_REDIS_MAX_CONNECTIONS)") from exc
        if waits:
            metrics.REDIS_CONNECTION_WAITS.labels("got").inc()
            metrics.REDIS_CONNECTION_WAIT_SECONDS.inc(time.monotonic() - started)
        return connection


def redis_client(settings: Settings) -> RedisClient:
    options: dict[str, Any] = {"socket_timeout": settings.redis_timeout_s,
                               "socket_connect_timeout": settings.redis_timeout_s}
    if settings.redis_url.startswith("rediss://"):  # TLS; the server's certificate and name checked
        options.update(ssl_ca_certs=settings.redis_ca_file or None, ssl_check_hostname=True)
    if settings.redis_cluster:  # its nodes' connections are the cluster client's own (packed in Python)
        return RedisCluster.from_url(settings.redis_url, **options)
    # ``Redis.from_url``'s steps, with the connection class its URL's scheme asks for packed in C
    # (the URL's own options win over any given: TLS stays TLS, a Unix socket stays one).
    url_options: dict[str, Any] = dict(parse_url(settings.redis_url))
    kind = url_options.get("connection_class", Connection)
    # Bounded, and waited for (up to the timeout): a burst of requests or pairs past the bound is
    # back-pressure; redis-py's default pool raised at its 100th connection, which the callers
    # took for an outage (503s, paused loops).
    most = url_options.pop("max_connections", None) or settings.redis_connections()
    pool = MeteredPool(**{**options, **url_options, "connection_class": C_PACKED.get(kind, kind)},
                                  max_connections=most, timeout=settings.redis_timeout_s)
    return Redis.from_pool(pool)  # the client owns its pool: closing it closes the pool


def kafka_connection(settings: Settings) -> dict[str, Any]:
    """How every Kafka client reaches the brokers: the addresses, and TLS and SASL as
    ``SGW_KAFKA_SECURITY_PROTOCOL`` and its settings say (a broker's certificate checked against
    ``SGW_KAFKA_SSL_CA_FILE`` or the system's CAs, its host name checked unless told not to)."""
    options: dict[str, Any] = {"bootstrap_servers": settings.kafka_bootstrap,
                               "security_protocol": settings.kafka_security_protocol}
    if settings.kafka_security_protocol in ("SSL", "SASL_SSL"):
        context = create_ssl_context(cafile=settings.kafka_ssl_ca_file or None,
                                     certfile=settings.kafka_ssl_cert_file or None,
                                     keyfile=settings.kafka_ssl_key_file or None)
        context.check_hostname = settings.kafka_ssl_check_hostname
        options["ssl_context"] = context
    if settings.kafka_security_protocol.startswith("SASL_"):
        options.update(sasl_mechanism=settings.kafka_sasl_mechanism, sasl_plain_username=settings.kafka_sasl_username,
                       sasl_plain_password=settings.kafka_sasl_password.get_secret_value())
    return options


def kafka_producer(settings: Settings, **options: Any) -> AIOKafkaProducer:
    """``options``: what one producer needs beyond the common ones (``max_request_size``)."""
    return AIOKafkaProducer(**kafka_connection(settings), enable_idempotence=True, acks="all",
                            linger_ms=settings.producer_linger_ms, max_batch_size=settings.producer_batch_bytes,
                            **options)


def kafka_consumer(settings: Settings, group_id: str | None, **options: Any) -> AIOKafkaConsumer:
    """``group_id`` None reads without a group (every partition, nothing committed)."""
    return AIOKafkaConsumer(**kafka_connection(settings), group_id=group_id,
                            enable_auto_commit=False, auto_offset_reset="earliest", **options)


def kafka_admin(settings: Settings) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**kafka_connection(settings))
