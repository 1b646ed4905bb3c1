"""1,024 judge pairs in flight against the real Redis (a judge answering in 300 ms): the worker
rates every trace with no outage and no error line, its pool bounded by what it drives
(redis-py's default pool raised at its 100th connection, and the worker took that for Redis
being down) and far from that bound (pairs share batched calls)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.harness import ROOT, WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.live_scoring import worker_metric as metric

pytestmark = [pytest.mark.integration, pytest.mark.alone]

IN_FLIGHT = 1024
LATENCY_S = 0.3
TRACES = 6000
CATALOG: dict[str, Any] = {
    "judges": [{"id": "quality", "name": "Quality", "criteria": "Is the answer right?"}],
    "groups": [{"id": "g-scale", "name": "At scale", "projectId": "p-scale",
                "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 1, "severity": "low"},
                "members": [{"kind": "judge", "refId": "quality", "weight": 1}]}],
    "budgets": [{"projectId": "p-scale", "judgeCallsPerWindow": 100_000, "windowSeconds": 3600}],
}


class JudgeProcess:
    """The local judge server in its own process (its threads off the test's interpreter), at a
    fixed latency; the most requests it held at once."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.bench.judge_process", str(LATENCY_S)],
                                     cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().decode().rsplit(" ", 1)[1].strip()
        self.answered = self.peak = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            _, _, total, peak = line.decode().split()
            self.answered, self.peak = int(total), int(peak)


@pytest.fixture
def judge() -> Iterator[JudgeProcess]:
    process = JudgeProcess()
    try:
        yield process
    finally:
        process.proc.terminate()
        process.proc.wait(10)


def trace(i: int) -> dict[str, Any]:
    return {"traceId": f"t-{i}", "projectId": "p-scale", "agentId": "a", "timestamp": "2026-12-07T12:00:00Z",
            "spans": [{"spanId": "r", "parentSpanId": None, "name": "agent.run", "input": f"question {i}",
                       "output": f"answer {i} [[rating=8]]"}]}


async def test_1024_judge_pairs_in_flight_rate_every_trace_with_no_outage_and_no_error_line(
        kafka_bootstrap: str, redis_db_url: str, unique: str, judge: JudgeProcess, tmp_path: Path) -> None:
    async with catalog_db(redis_db_url, CATALOG) as url:
        env = worker_env(kafka_bootstrap, url, unique, judge_base_url=judge.base_url, judge_timeout_s=60,
                         judge_concurrency=IN_FLIGHT, judge_concurrency_per_project=IN_FLIGHT,
                         commit_interval_s=0.5)
        worker = WorkerProcess(env).start(tmp_path)
        most_in_use = 0.0
        try:
            worker.wait_ready(90)
            await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                          [(f"t-{i}".encode(), orjson.dumps(trace(i))) for i in range(TRACES)])
            deadline = time.monotonic() + 240
            while judge.answered < TRACES and time.monotonic() < deadline:
                in_use = await asyncio.to_thread(worker.metric, "sgw_redis_connections", state="in_use")
                most_in_use = max(most_in_use, in_use)
                await asyncio.sleep(0.2)
            ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                       until=lambda v: len({r["traceId"] for r in v}) >= TRACES, timeout_s=120)
            metrics = await asyncio.to_thread(worker.metrics)
            unreachable = metric(metrics, "sgw_dependency_unreachable")
            waited_out = metric(metrics, "sgw_redis_connection_waits_total", outcome="deadline")
            bound = metric(metrics, "sgw_redis_connections", state="most")
            opened = metric(metrics, "sgw_redis_connections", state="open")  # the pool's high-water mark
        finally:
            code = worker.stop()
    logs = worker.logs(whole=True)
    lines = [orjson.loads(line) for line in logs.splitlines() if line.startswith("{")]
    bad = [line for line in lines if line.get("level") in ("error", "critical")
           or line.get("event") == "dependency unreachable; waiting for it"]

    print(f"judge peak in flight {judge.peak}, Redis connections in use at most {most_in_use:.0f} "
          f"(sampled), {opened:.0f} opened, of {bound:.0f}")
    assert code == 0, logs[-3000:]
    assert judge.peak >= 0.9 * IN_FLIGHT, f"the judge saw {judge.peak} calls at once, not ~{IN_FLIGHT}"
    assert {r["traceId"] for r in ratings} == {f"t-{i}" for i in range(TRACES)}
    assert all(r["rating"] == 8 for r in ratings)
    assert bad == [], bad[:5]
    assert unreachable == 0 and waited_out == 0
    assert bound >= IN_FLIGHT, "the pool's bound is derived from what the worker drives"
    # Pairs share batched calls and hold no connection while their judge answers: the pool never
    # neared the bound redis-py's default pool had (100), which the worker ran out of.
    assert opened < 100
