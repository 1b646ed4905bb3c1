"""The OTLP intake rides out a frozen Redis (its assembly buffer) in-process: spans keep arriving
while Redis is stopped, the worker waits instead of exiting, and afterwards every trace is
assembled and rated once with its value. Redis is a server of this test's own (frozen with
SIGSTOP), so the rest of the suite never sees it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from devtools.judge_server import JudgeServer
from devtools.redis_servers import LocalRedis
from services.groups import MonitorClient
from tests.support.harness import WorkerProcess, produce, read_topic, worker_env
from tests.support.otlp_records import Telemetry, records, span, trace_hex

pytestmark = pytest.mark.integration

FREEZE_S = 5
CATALOG = {
    "judges": [{"id": "q", "name": "Quality", "criteria": "Helpful?"}],
    "groups": [{"id": "g", "name": "G", "projectId": "p-o",
                "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low"},
                "members": [{"kind": "judge", "refId": "q", "weight": 1, "gate": False}]}],
}


def agent_trace(i: int) -> Telemetry:
    t = Telemetry(**{"service.name": "bot", "sgw.project.id": "p-o"})
    with span(t.tracer, "invoke_agent", **{"gen_ai.operation.name": "invoke_agent"}):
        with span(t.tracer, "chat", **{"gen_ai.operation.name": "chat", "gen_ai.output.messages": json.dumps(
                [{"role": "assistant", "parts": [{"type": "text", "content": f"answer [[rating={i % 11}]]"}]}])}):
            pass
    return t


async def test_a_frozen_redis_is_ridden_out_and_no_trace_is_lost_or_rated_twice(
        own_redis: LocalRedis, kafka_bootstrap: str, unique: str, judge: JudgeServer, tmp_path: Path) -> None:
    redis = Redis.from_url(own_redis.url)
    await MonitorClient(redis).apply(CATALOG)
    await redis.aclose()
    env = worker_env(kafka_bootstrap, own_redis.url, f"otlp-out-{unique}", judge_base_url=judge.base_url,
                     otlp_enabled="true", otlp_topic=f"otlp-out-{unique}", otlp_quiet_s=0.5,
                     otlp_flush_interval_s=0.2, outage_tolerance_s=60, redis_timeout_s=1, commit_interval_s=0.2)
    traces = [agent_trace(i) for i in range(40)]
    expected = {trace_hex(t.spans()[0]): float(i % 11) for i, t in enumerate(traces)}
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_OTLP_TOPIC"], [r for t in traces[:20] for r in records(t.spans())])
        await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 20)
        assert own_redis.proc is not None
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        try:
            await produce(kafka_bootstrap, env["SGW_OTLP_TOPIC"], [r for t in traces[20:] for r in records(t.spans())])
            await asyncio.sleep(FREEZE_S)
            assert worker.proc is not None and worker.proc.poll() is None, "the worker waits; it does not exit"
        finally:
            os.kill(own_redis.proc.pid, signal.SIGCONT)
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                   until=lambda v: len({r["traceId"] for r in v}) >= len(expected),
                                   timeout_s=90, settle_s=3)
    finally:
        assert worker.stop() == 0, worker.logs()

    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ratings:
        by_trace[r["traceId"]].append(r)
    assert set(by_trace) == set(expected), "no trace lost"
    for trace_id, published in by_trace.items():
        assert len({r["id"] for r in published}) == 1 and {r["rating"] for r in published} == {expected[trace_id]}
