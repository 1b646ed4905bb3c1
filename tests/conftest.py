"""Shared fixtures: the real Kafka broker and Redis server, started once per test session.

If SGW_KAFKA_BOOTSTRAP / SGW_REDIS_URL are set, those services are used instead; a given Redis
server holding keys is refused (the tests empty databases) unless SGW_TESTS_MAY_WIPE_REDIS=1. Services that
this run started are stopped when it ends, passed or failed. A service that cannot start fails
the tests that need it; nothing is skipped silently.

With SGW_REDIS_CLUSTER=true (``./dev test-cluster``) the run is against Redis Clusters started
here: the tests that touch Redis run, with cluster clients, and the rest are deselected - as are
the tests that freeze or wipe a single server of their own (``own_redis``): a cluster's outages
are the failover tests'.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from adapters.stores.client import RedisClient
from devtools.judge_server import JudgeServer
from devtools.redis_servers import LocalRedis, LocalRedisCluster
from devtools.services import LocalKafka
from tests.support.api_process import end_leftover_apis
from tests.support.harness import end_leftover_workers
from tests.support.redis_clients import connect, on_cluster
from tests.support.redis_databases import RedisClusters, RedisDatabases
from tests.support.redis_guard import refuse_foreign_keys


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not on_cluster():
        return
    kept = [item for item in items if _on_cluster_run(item)]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def _on_cluster_run(item: pytest.Item) -> bool:
    fixtures = set(getattr(item, "fixturenames", ()))
    return "redis_url" in fixtures and "own_redis" not in fixtures


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    given = os.environ.get("SGW_KAFKA_BOOTSTRAP")
    if given:
        yield given
        return
    kafka = LocalKafka().start()
    try:
        yield kafka.bootstrap
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    given = os.environ.get("SGW_REDIS_URL")
    if given:
        refuse_foreign_keys(given)  # before any test writes (or FLUSHDBs) anything there
        yield given
        return
    redis: LocalRedis | LocalRedisCluster = LocalRedisCluster() if on_cluster() else LocalRedis()
    redis.start()
    try:
        yield redis.url
    finally:
        redis.stop()


# The local chat-completions judge (devtools.judge_server): a test's own (``judge``), or a module's
# (``judge_server``: reset it between tests). A module may define its own to configure one.
@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer() as s:
        yield s


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    with JudgeServer() as s:
        yield s


@pytest.fixture
def own_redis() -> Iterator[LocalRedis]:
    """A Redis server of the test's own, for tests that freeze (SIGSTOP) or wipe it."""
    server = LocalRedis().start()
    try:
        yield server
    finally:
        if server.proc is not None:
            os.kill(server.proc.pid, signal.SIGCONT)  # never leave it frozen
        server.stop()


@pytest.fixture
def own_kafka() -> Iterator[LocalKafka]:
    """A broker of the test's own, for tests that freeze (SIGSTOP) or kill and restart it."""
    broker = LocalKafka().start()
    try:
        yield broker
    finally:
        if broker.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(broker.proc.pid, signal.SIGCONT)  # a frozen JVM would not stop on SIGTERM
        broker.stop()


@pytest.fixture(scope="session")
def redis_databases(redis_url: str) -> Iterator[RedisDatabases | RedisClusters]:
    """Hands out databases of the shared server one holder at a time (module fixtures lease one);
    on a cluster run, clusters of their own."""
    if not on_cluster():
        yield RedisDatabases(redis_url, _xdist_share() if os.environ.get("SGW_REDIS_URL") else (0, 1))
        return
    clusters = RedisClusters()
    try:
        yield clusters
    finally:
        clusters.stop()


@pytest.fixture
def redis_db_url(redis_databases: RedisDatabases) -> Iterator[str]:
    """A database of the shared server that is this test's alone, empty when the test starts:
    for tests that write global keys (the catalog, API keys) or run a worker."""
    with redis_databases.lease() as url:
        yield url


def _xdist_share() -> tuple[int, int]:
    """This process's place among pytest-xdist's workers (gw0, gw1...), which share a Redis
    server only when it is given (SGW_REDIS_URL); otherwise each starts its own."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw")), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[RedisClient]:
    """Database 0, shared by the tests that use it: they name their keys uniquely (``unique``)."""
    client = connect(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture(scope="session", autouse=True)
def no_api_outlives_the_session() -> Iterator[None]:
    """An API process still running when the session ends is stopped, and fails the run."""
    yield
    left = end_leftover_apis()
    assert not left, f"API processes outlived the tests that started them (logs: {left})"


@pytest.fixture(autouse=True)
def no_worker_outlives_its_test() -> Iterator[None]:
    """A worker process left running by a failed test is killed when the test ends."""
    yield
    end_leftover_workers()


@pytest.fixture
def unique() -> str:
    """A fresh suffix for topic, group and key names, so tests never see each other's data."""
    return uuid.uuid4().hex[:10]
