"""The worker on a replicated Kafka cluster: three KRaft brokers on loopback (``LocalKafkaCluster``).

The live-scoring scenario runs there whole; the topics the worker creates get 3 replicas and
``min.insync.replicas`` 2; and the broker leading the traces partitions crashes (SIGKILL) with
traffic flowing, then comes back: no pair is lost, none gets two rating ids or two values, the
worker never exits and is ready again by itself.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from deploy.judge_server import JudgeServer
from deploy.services import LocalKafkaCluster
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.live_scoring import catalog, check_live_scoring, trace

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalKafkaCluster]:
    brokers = LocalKafkaCluster(nodes=3).start()
    try:
        yield brokers
    finally:
        brokers.stop()


@pytest.fixture
async def env(cluster: LocalKafkaCluster, redis_db_url: str, unique: str) -> AsyncIterator[dict[str, str]]:
    with JudgeServer() as judge, ScriptedServer(default=Reply(body={"score": 0.5})) as external, \
            ScriptedServer(default=Reply(status=204, body=b"")) as receiver:
        async with catalog_db(redis_db_url, catalog(external.url + "/score", receiver.url)) as url:
            yield worker_env(cluster.bootstrap, url, unique, topic_partitions=4, judge_base_url=judge.base_url,
                             judge_timeout_s=5, egress_allow="127.0.0.0/8", max_trace_bytes=4096,
                             commit_interval_s=0.2)


async def test_live_scoring_on_three_brokers_with_replicated_topics(
        env: dict[str, str], cluster: LocalKafkaCluster, tmp_path: Path) -> None:
    await check_live_scoring(env, cluster.bootstrap, tmp_path)
    admin = AIOKafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    await admin.start()
    try:
        topics = [env["SGW_TRACES_TOPIC"], env["SGW_RATINGS_TOPIC"], env["SGW_DLQ_TOPIC"]]
        described = await admin.describe_topics(topics)
        assert {t["topic"]: {len(p["replicas"]) for p in t["partitions"]} for t in described} == \
            {t: {3} for t in topics}, "every partition on all three brokers"
        configs = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
        min_isr = {entry[0] for response in configs for resource in response.resources
                   for entry in resource[4] if entry[0] == "min.insync.replicas" and entry[1] == "2"}
        assert min_isr == {"min.insync.replicas"}, configs
    finally:
        await admin.close()


async def _leader_of_most_partitions(bootstrap: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    led: dict[int, int] = defaultdict(int)
    for partition in described["partitions"]:
        led[partition["leader"]] += 1
    return max(led, key=lambda node: led[node])


async def test_the_traces_leader_crashes_and_returns_under_load_nothing_lost_nothing_doubled(
        env: dict[str, str], cluster: LocalKafkaCluster, tmp_path: Path) -> None:
    # Deterministic groups only (b-det), so every value is known: 3 waves of 100 traces, the
    # broker leading most traces partitions killed after the first and restarted after the second.
    waves = [[trace(i, "p-b") for i in range(w * 100, w * 100 + 100)] for w in range(3)]
    worker = WorkerProcess(env).start(tmp_path)
    topic = env["SGW_TRACES_TOPIC"]
    killed: int | None = None
    try:
        worker.wait_ready()
        await produce(cluster.bootstrap, topic, [(t["traceId"].encode(), orjson.dumps(t)) for t in waves[0]])
        await read_topic(cluster.bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 50)
        killed = await _leader_of_most_partitions(cluster.bootstrap, topic)
        cluster.kill(killed)  # SIGKILL, with the first wave still being scored
        await produce(cluster.bootstrap, topic, [(t["traceId"].encode(), orjson.dumps(t)) for t in waves[1]])
        await asyncio.to_thread(cluster.restart, killed)
        killed = None
        await produce(cluster.bootstrap, topic, [(t["traceId"].encode(), orjson.dumps(t)) for t in waves[2]])
        ratings = await read_topic(cluster.bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=180, settle_s=3,
                                   until=lambda v: len({r["traceId"] for r in v}) >= 300)
        assert worker.proc is not None and worker.proc.poll() is None, "the worker rode it out"
        await asyncio.to_thread(worker.wait_ready, 60)  # and is ready again by itself
    finally:
        if killed is not None:
            cluster.restart(killed)
        code = worker.stop()
    assert code == 0, worker.logs()
    ids: dict[str, set[str]] = defaultdict(set)
    values: dict[str, set[Any]] = defaultdict(set)
    for r in ratings:
        ids[r["traceId"]].add(r["id"])
        values[r["traceId"]].add(r["rating"])
    assert set(ids) == {t["traceId"] for wave in waves for t in wave}, "no trace lost"
    assert all(len(v) == 1 for v in ids.values()), "one rating id per pair"
    assert all(len(v) == 1 for v in values.values()), "one value per pair"
