"""The foundation: the real broker and the real Redis server answer as the worker needs."""

from __future__ import annotations

import asyncio
import socket
import sys
import time

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from adapters.stores.claims import Claims
from devtools import services
from devtools.processes import free_port as real_free_port
from devtools.redis_servers import LocalRedis
from devtools.services import LocalKafka
from scoring.claim_request import ClaimRequest, day_of
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

MESSAGES = 10_000
PARTITIONS = 6


async def test_kafka_round_trip_of_10000_messages_through_a_consumer_group(
    kafka_bootstrap: str, unique: str
) -> None:
    topic, group = f"foundation-{unique}", f"foundation-group-{unique}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)])
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5,
                                enable_idempotence=True)
    await producer.start()
    try:
        sends = [await producer.send(topic, key=str(i).encode(), value=orjson.dumps({"n": i}))
                 for i in range(MESSAGES)]
        metadata = await asyncio.gather(*sends)
    finally:
        await producer.stop()
    assert {m.partition for m in metadata} == set(range(PARTITIONS)), "keys spread over partitions"

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=group,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    seen: list[int] = []
    try:
        async with asyncio.timeout(60):
            while len(seen) < MESSAGES:
                batches = await consumer.getmany(timeout_ms=500, max_records=2000)
                for records in batches.values():
                    seen.extend(orjson.loads(r.value)["n"] for r in records)
        await consumer.commit()
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        end_offsets = await consumer.end_offsets(partitions)
        committed = {tp: await consumer.committed(tp) for tp in partitions}
    finally:
        await consumer.stop()

    assert sorted(seen) == list(range(MESSAGES)), "every message once, none lost or doubled"
    assert committed == end_offsets, "the group's committed offsets reach the end of each partition"
    assert sum(end_offsets.values()) == MESSAGES


async def test_the_claim_script_runs_atomically_on_real_redis(redis_url: str, unique: str) -> None:
    # Eight workers race for the same (group, trace) pair with the project's own Lua script:
    # exactly one wins and reserves its judge calls; the others see a live lease.
    clients = [connect(redis_url) for _ in range(8)]
    workers = [Claims(client) for client in clients]
    pair = ClaimRequest(project_id=f"p-{unique}", group_id="g", subject_key="trace:t-1", judge_calls=3,
                        calls_cap=10, day=day_of(time.time()))
    try:
        results = await asyncio.gather(*[w.claim_many([pair]) for w in workers])
        states = sorted(state.state for (state,) in results)
        assert states == ["busy"] * 7 + ["claimed"]
        assert await workers[0].budget_used(pair.project_id, 3600) == 3, "one reservation, not eight"
    finally:
        for client in clients:
            await client.aclose()


@pytest.mark.parametrize("service", [LocalRedis, LocalKafka])
def test_a_port_taken_before_the_service_binds_it_is_replaced(
        service: type[LocalRedis] | type[LocalKafka], monkeypatch: pytest.MonkeyPatch) -> None:
    # Another process grabs the port between free_port() choosing it and the service binding it.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        launcher = sys.modules[service.__module__]  # where the service looks its free ports up
        monkeypatch.setattr(launcher, "free_port", lambda: next(ports, None) or real_free_port())
        started = service().start()
        try:
            assert started.port != taken
            with socket.create_connection(("127.0.0.1", started.port), timeout=5):
                pass
        finally:
            started.stop()


def test_a_kafka_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    # b"\xf8..." encodes to "-..." in url-safe base64: the storage tool would read it as an option.
    draws = iter([services.uuid.UUID(bytes=b"\xf8" + bytes(15)),
                  services.uuid.UUID(bytes=b"\x10" + bytes(15))])
    monkeypatch.setattr(services.uuid, "uuid4", lambda: next(draws))
    assert services.kafka_cluster_id() == "EAAAAAAAAAAAAAAAAAAAAA"


async def test_a_killed_broker_restarts_on_its_port_with_its_data(unique: str) -> None:
    # The chaos test kills its broker (SIGKILL, as a crash) and starts it again: clients must find
    # it where it was, with the records and the committed offsets it had.
    topic, group = f"restart-{unique}", f"restart-group-{unique}"
    broker = LocalKafka().start()
    try:
        bootstrap, workdir = broker.bootstrap, broker.workdir
        await produce_numbers(bootstrap, topic, range(100))
        assert await consume_numbers(bootstrap, topic, group, 100) == list(range(100))  # commits at 100

        broker.kill()
        assert broker.proc is not None and broker.proc.returncode == -9
        with pytest.raises(ConnectionRefusedError):  # the broker is down
            socket.create_connection(("127.0.0.1", broker.port), timeout=5).close()
        broker.restart()

        assert (broker.bootstrap, broker.workdir) == (bootstrap, workdir), "same port, same data"
        await produce_numbers(bootstrap, topic, range(100, 110))
        assert await consume_numbers(bootstrap, topic, group, 10) == list(range(100, 110)), \
            "the group resumes from the offset it committed before the crash"
        assert await consume_numbers(bootstrap, topic, None, 110) == list(range(110)), "no record lost"
    finally:
        broker.stop()


async def produce_numbers(bootstrap: str, topic: str, numbers: range) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        for n in numbers:
            await producer.send_and_wait(topic, value=orjson.dumps(n))
    finally:
        await producer.stop()


async def consume_numbers(bootstrap: str, topic: str, group: str | None, count: int) -> list[int]:
    """Read ``count`` records (from the group's committed offset, or from the start without a
    group), then commit them for the group."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    seen: list[int] = []
    try:
        async with asyncio.timeout(60):
            while len(seen) < count:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    seen.extend(orjson.loads(r.value) for r in records)
        if group is not None:
            await consumer.commit()
    finally:
        await consumer.stop()
    return seen
