"""Spend in the live worker (a subprocess on the real broker and Redis, judges through the local
judge server): a gates-first group calls no judge for a trace whose free must-pass pattern
failed, reserves its judges' calls only once the gate passed (skipping the group whole when they
do not fit), and every judge verdict carries its tokens, counted per project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.stores.ratings import RatingsStore
from devtools.judge_server import JudgeServer
from tests.support.harness import WorkerProcess, produce, read_topic
from tests.support.redis_clients import connect

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}
CATALOG: dict[str, Any] = {
    "judges": [{"id": "help", "name": "Helpfulness", "criteria": "Helpful?"},
               {"id": "tone", "name": "Tone", "criteria": "Polite?"}],
    "patterns": [{"id": "pii", "name": "PII", "polarity": "failure", "template": "email"}],
    "groups": [{"id": "g-first", "name": "Gates first", "projectId": "p-g", "online": ONLINE, "gatesFirst": True,
                "members": [{"kind": "pattern", "refId": "pii", "weight": 0, "gate": True},
                            {"kind": "judge", "refId": "help", "weight": 1},
                            {"kind": "judge", "refId": "tone", "weight": 1}]}],
    # Room for two clean traces' judges (2 calls each), not three.
    "budgets": [{"projectId": "p-g", "judgeCallsPerWindow": 4, "windowSeconds": 3600}],
}


def trace(name: str, leaks: bool) -> dict[str, Any]:
    text = f"answer {name} " + ("mail me at jane@example.com " if leaks else "") + f"[[rating=8]] [[key={name}]]"
    return {"traceId": name, "projectId": "p-g", "agentId": "agent-g", "timestamp": "2026-12-02T13:00:00Z",
            "spans": [{"spanId": "r", "parentSpanId": None, "name": "agent.run", "input": "q", "output": text}]}


# env (tests/e2e/conftest.py): a worker's environment with this catalog and these settings
pytestmark = [pytest.mark.integration, pytest.mark.worker(CATALOG, judge_timeout_s=5, commit_interval_s=0.2)]


async def test_gates_first_spends_only_on_traces_whose_gates_passed(
        env: dict[str, str], kafka_bootstrap: str, judge: JudgeServer, tmp_path: Path) -> None:
    leaking = [trace(f"leak-{i}", True) for i in range(4)]
    clean = [trace(f"clean-{i}", False) for i in range(3)]
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                      [(t["traceId"].encode(), orjson.dumps(t)) for t in leaking + clean])
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 6,
                                   settle_s=2)
        metrics_text = worker.metrics()
    finally:
        code = worker.stop()
    assert code == 0, worker.logs()

    by_trace = {r["traceId"]: r for r in ratings}
    assert len(ratings) == 6 == len(by_trace)
    for t in leaking:
        r = by_trace[t["traceId"]]
        assert r["rating"] == 0 and r["reason"] == 'Must-pass member "PII" failed (goodness 0.00 < 0.5)'
        assert [(m["name"], m["status"]) for m in r["members"]] == [
            ("PII", "scored"), ("Helpfulness", "skipped"), ("Tone", "skipped")]
        assert judge.calls_by_key[t["traceId"]] == 0, "no judge call for a trace whose cheap gate failed"
    scored = [t["traceId"] for t in clean if t["traceId"] in by_trace]
    assert len(scored) == 2, "the third clean trace found no room for its judges: skipped whole"
    for name in scored:
        r = by_trace[name]
        assert r["rating"] == 8 and judge.calls_by_key[name] == 2
        assert all(m["usage"]["promptTokens"] > 0 and m["usage"]["completionTokens"] > 0
                   for m in r["members"] if m["kind"] == "judge")
    assert sum(judge.calls_by_key.values()) == 4, "the budget counts the calls made, and no more were made"
    assert metric(metrics_text, "sgw_groups_skipped_total", why="budget") == 1
    prompt = metric(metrics_text, "sgw_judge_tokens_total", project="p-g", direction="prompt")
    completion = metric(metrics_text, "sgw_judge_tokens_total", project="p-g", direction="completion")
    assert prompt > 0 and completion > 0
    reported = sum(m["usage"]["promptTokens"] for r in ratings for m in r["members"] if "usage" in m)
    assert prompt == reported, "the metric counts what the ratings carry"

    # Every published rating is among the group's latest results, as published.
    redis = connect(env["SGW_REDIS_URL"])
    documents, _ = await RatingsStore(redis).results("g-first", limit=50)
    await redis.aclose()
    assert sorted(orjson.loads(d)["id"] for d in documents) == sorted(r["id"] for r in ratings)


def metric(text: str, name: str, **labels: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()))
