"""The worker on a replicated Kafka cluster: three KRaft brokers on loopback (``LocalKafkaCluster``).

The live-scoring scenario runs there whole, and the topics the worker creates get 3 replicas
and ``min.insync.replicas`` 2. A broker failing over under load, with a Redis primary too, is
the cluster chaos test's (tests/reliability/test_chaos_cluster.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from devtools.judge_server import JudgeServer
from devtools.services import LocalKafkaCluster
from tests.support.harness import catalog_db, worker_env
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.live_scoring import catalog, check_live_scoring

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
