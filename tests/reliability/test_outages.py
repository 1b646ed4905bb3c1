"""The worker rides out outages in-process: Redis frozen, then Redis losing its data, while a
real worker scores a stream on the real broker. It never exits, says why it is not ready while
it waits, and afterwards every trace is rated with one rating id and one value. An outage past
SGW_OUTAGE_TOLERANCE_S ends it (exit 1), and another worker rates what it left.

Redis here is a server of this test's own (it is frozen with SIGSTOP and wiped), so the rest of
the suite never sees it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from redis.asyncio import Redis

from devtools.redis_servers import LocalRedis
from devtools.services import LocalKafka
from services.groups import MonitorClient
from tests.support.harness import WorkerProcess, produce, read_topic, worker_env
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

FREEZE_S = 8
CATALOG = {
    "patterns": [{"id": "sorry", "name": "Apology", "polarity": "failure", "template": "apology"}],
    "groups": [{"id": "tone", "name": "Tone", "projectId": "p-out",
                "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "low"},
                "members": [{"kind": "pattern", "refId": "sorry", "weight": 1, "gate": False}]}],
}


def traces(start: int, count: int) -> list[tuple[bytes, bytes]]:
    return [(f"o-{i}".encode(), orjson.dumps({
        "traceId": f"o-{i}", "projectId": "p-out", "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
        "spans": [{"spanId": "r", "input": "q", "output": "I'm sorry" if i % 2 else "done"}]}))
        for i in range(start, start + count)]


def readiness(worker: WorkerProcess) -> tuple[int, str]:
    try:
        response = httpx.get(worker.url + "/readyz", timeout=2)
        return response.status_code, response.text
    except httpx.HTTPError as exc:
        return 0, repr(exc)


async def test_redis_frozen_then_wiped_is_ridden_out(own_redis: LocalRedis, kafka_bootstrap: str,
                                                     unique: str, tmp_path: Path) -> None:
    redis = Redis.from_url(own_redis.url)
    await MonitorClient(redis).apply(CATALOG)
    env = worker_env(kafka_bootstrap, own_redis.url, f"out-{unique}", outage_tolerance_s=60, redis_timeout_s=1)
    worker = WorkerProcess(env).start(tmp_path)
    seen_not_ready: list[str] = []
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], traces(0, 100))
        await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 100)

        # 1. Redis frozen for FREEZE_S while traces keep arriving.
        assert own_redis.proc is not None
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], traces(100, 100))
        while time.monotonic() - frozen_at < FREEZE_S:
            status, text = readiness(worker)
            if status == 503:
                seen_not_ready.append(text)
            assert worker.proc is not None and worker.proc.poll() is None, worker.logs()
            await asyncio.sleep(0.25)
        os.kill(own_redis.proc.pid, signal.SIGCONT)
        await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len({r["traceId"] for r in v}) >= 200,
                         timeout_s=90)

        # 2. Redis loses everything (a restart without persistence): the catalog snapshot is kept.
        await redis.flushall()
        await asyncio.sleep(1.5)  # the watcher notices
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], traces(200, 50))
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                   until=lambda v: len({r["traceId"] for r in v}) >= 250, timeout_s=90, settle_s=2)
        assert worker.metric("sgw_catalog_lost") == 1.0
        assert worker.proc is not None and worker.proc.poll() is None, worker.logs()
    finally:
        code = worker.stop()
        await redis.aclose()
    assert code == 0, worker.logs()

    assert any("redis unreachable" in text for text in seen_not_ready), seen_not_ready
    ids: dict[str, set[str]] = defaultdict(set)
    values: dict[str, set[Any]] = defaultdict(set)
    for r in ratings:
        ids[r["traceId"]].add(r["id"])
        values[r["traceId"]].add(r["rating"])
    assert set(ids) == {f"o-{i}" for i in range(250)}, "no trace is lost"
    assert all(len(v) == 1 for v in ids.values()), "one rating id per trace"
    assert all(len(v) == 1 for v in values.values()), "one value per trace"
    assert {next(iter(values[f"o-{i}"])) for i in range(0, 250, 2)} == {10.0}
    assert {next(iter(values[f"o-{i}"])) for i in range(1, 250, 2)} == {0.0}


async def test_a_frozen_broker_is_ridden_out(own_kafka: LocalKafka, redis_db_url: str, unique: str,
                                             tmp_path: Path) -> None:
    url = redis_db_url
    redis = connect(url)
    await MonitorClient(redis).apply(CATALOG)
    bootstrap = own_kafka.bootstrap
    env = worker_env(bootstrap, url, f"kout-{unique}", outage_tolerance_s=90)
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        await produce(bootstrap, env["SGW_TRACES_TOPIC"], traces(0, 100))
        await read_topic(bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 100)
        assert own_kafka.proc is not None
        os.kill(own_kafka.proc.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        while time.monotonic() - frozen_at < FREEZE_S:
            assert worker.proc is not None and worker.proc.poll() is None, worker.logs()
            await asyncio.sleep(0.5)
        os.kill(own_kafka.proc.pid, signal.SIGCONT)
        await produce(bootstrap, env["SGW_TRACES_TOPIC"], traces(100, 100))
        ratings = await read_topic(bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=120, settle_s=2,
                                   until=lambda v: len({r["traceId"] for r in v}) >= 200)
        assert worker.proc is not None and worker.proc.poll() is None, worker.logs()
    finally:
        code = worker.stop(timeout_s=60)
        await redis.aclose()
    assert code == 0, worker.logs()
    ids: dict[str, set[str]] = defaultdict(set)
    for r in ratings:
        ids[r["traceId"]].add(r["id"])
    assert set(ids) == {f"o-{i}" for i in range(200)}, "no trace is lost"
    assert all(len(v) == 1 for v in ids.values()), "one rating id per trace"


async def test_an_outage_past_the_tolerance_ends_the_worker(own_redis: LocalRedis, kafka_bootstrap: str,
                                                            unique: str, tmp_path: Path) -> None:
    redis = Redis.from_url(own_redis.url)
    await MonitorClient(redis).apply(CATALOG)
    await redis.aclose()
    env = worker_env(kafka_bootstrap, own_redis.url, f"past-{unique}", outage_tolerance_s=3, redis_timeout_s=1,
                     shutdown_timeout_s=5)
    first, second = WorkerProcess(env, name="first").start(tmp_path), WorkerProcess(env, name="second")
    assert own_redis.proc is not None and first.proc is not None
    try:
        first.wait_ready()
        # 1. Redis frozen longer than the tolerance while traces arrive: the worker gives up.
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], traces(0, 20))
        deadline = time.monotonic() + 60
        while first.proc.poll() is None:
            assert time.monotonic() < deadline, f"still running 60s into an outage tolerated for 3s:\n{first.logs()}"
            await asyncio.sleep(0.25)
        assert first.proc.returncode == 1, first.logs()
        assert "past the tolerance" in first.logs(whole=True), first.logs()

        # 2. Redis back: a worker started in its place rates every trace the first left.
        os.kill(own_redis.proc.pid, signal.SIGCONT)
        second.start(tmp_path)
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=90,
                                   until=lambda v: len({r["traceId"] for r in v}) >= 20)
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
        if first.proc.poll() is None:
            first.stop()
        code = second.stop() if second.proc is not None else 0
    assert code == 0, second.logs()
    assert {r["traceId"] for r in ratings} == {f"o-{i}" for i in range(20)}, "nothing the first worker held is lost"
