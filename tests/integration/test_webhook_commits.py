"""The webhook sender's offset commits failing for a while is an outage it waits out, as the
trace loop does (one rule for a failed commit, ``consumers.loop``): it keeps running, says so in
``outage`` (hence ``/readyz``), delivers everything, and commits once it can again. Before the one
loop, the first failed commit ended the sender, and the worker with it.

The commits fail for real: the sender's consumer is moved off the webhooks topic's partition
(onto another topic) while that partition's offsets are still to be committed, which the broker
refuses as it refuses a commit that a rebalance or a broker bounce catches under way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from adapters.egress import EgressPolicy
from adapters.stores.catalog import CatalogStore
from adapters.stores.deliveries import DeliverySchedule
from consumers.outage import OutageGuard
from consumers.webhook_lanes import SenderLimits
from consumers.webhooks import WebhookSender
from scoring.results import Signal, build_deliveries
from scoring.webhooks.retries import RetrySchedule
from services.groups import MonitorClient
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.redis_clients import connect
from tests.support.trace_loop import until

pytestmark = pytest.mark.integration


def delivery(receiver: ScriptedServer, n: int) -> bytes:
    signal = Signal(id=f"s-{n}", key="scorer-group:g", group_id="g", group_name="G", project_id="p-c",
                    agent_id="agent-c", scope="trace", trace_id=f"t-{n}", rating=1.0, alert_threshold=5.0,
                    severity="low", justification="j", rating_id=f"r-{n}", raised_at=datetime.now(UTC))
    return build_deliveries(signal, [receiver.url + "/hook"])[0].to_json()


@pytest.fixture
def receiver() -> Iterator[ScriptedServer]:
    with ScriptedServer(default=Reply(body={"ok": True})) as server:
        yield server


async def test_commits_failing_for_a_while_leave_the_sender_up_and_every_delivery_arrives(
        kafka_bootstrap: str, redis_db_url: str, unique: str, receiver: ScriptedServer) -> None:
    hooks, other, dlq = f"wc-hooks-{unique}", f"wc-other-{unique}", f"wc-dlq-{unique}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, 1, 1) for t in (hooks, other, dlq)])
    finally:
        await admin.close()
    redis = connect(redis_db_url)
    await MonitorClient(redis).apply({"channels": [{"agentId": "agent-c", "url": receiver.url + "/hook"}]})
    snapshot = await CatalogStore(redis).snapshot()
    retry = RetrySchedule.parse("200ms")

    async def never_disabled(_id: str, _reason: str) -> bool:
        return False

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"wc-{unique}",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    sender = WebhookSender(consumer=consumer, producer=producer, dlq_topic=dlq, catalog=lambda: snapshot,
                           schedule=DeliverySchedule(redis, lease_s=60, schedule=retry), retry=retry,
                           egress=EgressPolicy.parse(["127.0.0.0/8"]), disable=never_disabled,
                           limits=SenderLimits(commit_interval_s=0.05), outages=OutageGuard(tolerance_s=60))
    stop = asyncio.Event()
    await producer.start()
    consumer.subscribe([hooks], listener=sender.rebalance_listener())
    await consumer.start()
    running = asyncio.create_task(sender.run(stop))
    tp = TopicPartition(hooks, 0)

    async def committed_is(offset: int) -> bool:
        return ((await consumer.committed(tp)) or 0) == offset

    try:
        for n in range(3):
            await producer.send_and_wait(hooks, delivery(receiver, n))
        await until(lambda: len(receiver.requests) == 3, "the first deliveries")
        await until(lambda: committed_is(3), "their offsets committed")

        # The consumer loses the partition while offsets of it are still to be committed: the
        # records it fetched are finished and their commit now fails, tick after tick. No commit
        # on the timer until the move (a loaded machine's commit of them raced the move, and
        # then nothing failed): they are finished, not committed, when the partition goes.
        committer = sender.loop._committer
        committer.interval_s = 3600.0
        for n in range(3, 6):
            await producer.send_and_wait(hooks, delivery(receiver, n))
        await producer.send_and_wait(other, b"not a delivery")
        await until(lambda: len(receiver.requests) == 6, "the next deliveries, fetched before the move")
        assert await committed_is(3), "offsets 3-5 are still to be committed at the move"
        consumer.unsubscribe()
        consumer.assign([TopicPartition(other, 0)])
        committer.interval_s = 0.05  # back on the timer: the lost partition's commit fails, tick after tick
        await until(lambda: (sender.outage or "").startswith("offset commits failing for "),
                    "the failing commits to be reported")
        assert not running.done(), "the sender waits the failing commits out"
        await asyncio.sleep(1.0)  # a few seconds of failing commits, well within the tolerance
        assert not running.done() and sender.failed is None

        # The partition comes back: commits succeed again, the outage is over, deliveries go on.
        consumer.unsubscribe()
        consumer.subscribe([hooks], listener=sender.rebalance_listener())
        for n in range(6, 9):
            await producer.send_and_wait(hooks, delivery(receiver, n))
        await until(lambda: len(receiver.requests) == 9, "the deliveries after the commits came back")
        await until(lambda: committed_is(9), "every offset committed")
        await until(lambda: sender.outage is None, "the outage to be over")
        assert not running.done()
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        await consumer.stop()
        await producer.stop()
        await redis.aclose()
    ids = [r.headers["webhook-id"] for r in receiver.requests]
    assert len(ids) == len(set(ids)) == 9, "every delivery arrived, once"
    assert sender.failed is None
