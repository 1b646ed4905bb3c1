"""Reliability: a worker killed with SIGKILL mid-stream loses nothing; what it had in flight is
scored again by the worker that takes over (after its leases expire), under the same rating ids
and with the same ratings, and judge budget is spent again only for that in-flight work."""

from __future__ import annotations

import signal
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.stores.claims import Claims
from devtools.judge_server import Behaviour, JudgeServer
from tests.support.harness import WorkerProcess, produce, read_topic
from tests.support.redis_clients import connect

TRACES = 300
MAX_IN_FLIGHT = 20
CATALOG = {
    "judges": [{"id": "q", "name": "Quality", "criteria": "Helpful?"}],
    "patterns": [{"id": "e", "name": "Email", "polarity": "failure", "template": "email"}],
    "groups": [{"id": "g", "name": "G", "projectId": "p-r",
                "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "low"},
                "members": [{"kind": "judge", "refId": "q", "weight": 1, "gate": False},
                            {"kind": "pattern", "refId": "e", "weight": 0, "gate": True}]}],
    "budgets": [{"projectId": "p-r", "judgeCallsPerWindow": 100000, "windowSeconds": 86400}],
}


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer() as s:
        s.set_default(Behaviour.deterministic(delay=0.05))  # slow enough to be caught mid-flight
        yield s


# env (tests/e2e/conftest.py): a worker's environment with this catalog and these settings
pytestmark = [pytest.mark.integration, pytest.mark.worker(CATALOG, max_in_flight=MAX_IN_FLIGHT, claim_lease_s=3,
                                                          member_deadline_s=2, commit_interval_s=0.5)]


def trace(i: int) -> dict[str, Any]:
    return {"traceId": f"t-{i}", "projectId": "p-r", "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
            "spans": [{"spanId": "r", "input": "q", "output": f"answer {i} [[rating={i % 11}]]"}]}


async def test_sigkill_mid_stream_loses_nothing_and_never_rates_differently(
        env: dict[str, str], kafka_bootstrap: str, tmp_path: Path) -> None:
    first = WorkerProcess(env, name="first").start(tmp_path)
    second = WorkerProcess(env, name="second")
    try:
        first.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                      [(f"t-{i}".encode(), orjson.dumps(trace(i))) for i in range(TRACES)])
        await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= TRACES // 3)
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)  # no drain, no commit, leases left behind
        first.proc.wait()
        second.start(tmp_path)
        second.wait_ready()
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                   until=lambda v: len({r["traceId"] for r in v}) >= TRACES,
                                   timeout_s=120, settle_s=4)
        redis = connect(env["SGW_REDIS_URL"])
        spent = await Claims(redis).budget_used("p-r", 86400)
        await redis.aclose()
    finally:
        assert second.stop() == 0, second.logs()

    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ratings:
        by_trace[r["traceId"]].append(r)
    assert set(by_trace) == {f"t-{i}" for i in range(TRACES)}, "nothing lost"
    for trace_id, published in by_trace.items():
        assert len({r["id"] for r in published}) == 1, f"{trace_id}: one rating id"
        assert len({r["rating"] for r in published}) == 1, f"{trace_id}: never a different rating"
    repeated = sum(len(p) - 1 for p in by_trace.values())
    print(f"republished {repeated}, budget spent {spent} for {TRACES} traces")
    assert repeated <= MAX_IN_FLIGHT, "only what was in flight at the crash is published again"
    assert TRACES <= spent <= TRACES + MAX_IN_FLIGHT, "budget spent again only for in-flight work"

