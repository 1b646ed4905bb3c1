"""The live-scoring scenario (tests/e2e/test_live_scoring.py), shared with the runs of it on other
clusters (tests/e2e/test_kafka_cluster.py): the catalog, the traces, the hand-computed scores, and
the whole check of what one worker publishes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.harness import WorkerProcess, produce, read_topic
from tests.support.sampling_reference import reference_keep

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}
LEN_CODE = ("def score(input, output, expected, spans, metadata):\n"
            "    return 1.0 if 'good' in output else 0.25\n")


def catalog(external_url: str, hooks_url: str) -> dict[str, Any]:
    def m(kind: str, ref: str, weight: float, gate: bool = False) -> dict[str, Any]:
        return {"kind": kind, "refId": ref, "weight": weight, "gate": gate}

    return {
        "judges": [{"id": "help", "name": "Helpfulness", "criteria": "Helpful?"},
                   {"id": "safe", "name": "Safety", "criteria": "Safe?"}],
        "patterns": [{"id": "email", "name": "Email", "polarity": "failure", "template": "email"}],
        "customs": [{"id": "len", "name": "Good word", "type": "code", "code": LEN_CODE},
                    {"id": "ext", "name": "External", "type": "external", "url": external_url}],
        "groups": [
            {"id": "a-full", "name": "Full", "projectId": "p-a", "online": ONLINE,
             "members": [m("judge", "help", 2), m("judge", "safe", 1, True), m("pattern", "email", 0, True),
                         m("custom", "len", 1), m("custom", "ext", 1)]},
            {"id": "a-half", "name": "Half", "projectId": "p-a",
             "online": {**ONLINE, "sampleRate": 0.5, "alertThreshold": None},
             "members": [m("judge", "help", 1)]},
            {"id": "a-session", "name": "Session", "projectId": "p-a",
             "online": {**ONLINE, "scope": "session"}, "members": [m("judge", "help", 1)]},
            {"id": "b-det", "name": "Deterministic", "projectId": "p-b",
             "online": {**ONLINE, "alertThreshold": 5, "severity": "low"},
             "members": [m("pattern", "email", 1), m("custom", "len", 1)]},
            {"id": "c-budget", "name": "Budgeted", "projectId": "p-c", "online": ONLINE,
             "members": [m("judge", "help", 1), m("judge", "safe", 1)]},
        ],
        "budgets": [{"projectId": "p-c", "judgeCallsPerWindow": 4, "windowSeconds": 3600}],
        # A receiver on loopback: the worker never looks up or calls a public host.
        "channels": [{"agentId": "agent-a", "url": f"{hooks_url}/one", "secret": "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"},
                     {"agentId": "agent-a", "url": f"{hooks_url}/two"}],
    }


def trace(i: int, project: str) -> dict[str, Any]:
    rating = i % 11
    words = ("good " if i % 3 == 0 else "meh ") + ("mail x.y@example.com " if i % 7 == 0 else "")
    return {"traceId": f"t-{project}-{i}", "projectId": project, "agentId": "agent-a" if project == "p-a" else "agent-b",
            "sessionId": f"s-{i % 4}", "timestamp": f"2026-12-02T13:{i // 60:02d}:{i % 60:02d}Z",
            "spans": [{"spanId": "r", "parentSpanId": None, "name": "agent.run", "input": f"question {i}",
                       "output": f"answer {i} {words}[[rating={rating}]]"}]}


def expected_score(i: int, group: str) -> float | None:
    """Hand-computed from the spec, independent of the engine."""
    judge = (i % 11) / 10
    good = 1.0 if i % 3 == 0 else 0.25
    email = i % 7 == 0
    if group == "a-full":
        if judge < 0.5 or email:  # Safety gate (judge under 5/10) or the email tripwire
            return 0.0
        return 10 * (2 * judge + 1 * judge + good + 0.5) / 5
    if group == "a-half":
        return 10 * judge
    if group == "b-det":
        return 10 * ((0.0 if email else 1.0) + good) / 2
    raise AssertionError(group)


def key_of(value: dict[str, Any]) -> tuple[str, str]:
    return value["groupId"], value["traceId"]


async def check_live_scoring(env: dict[str, str], kafka_bootstrap: str, tmp_path: Path) -> None:
    """The whole scenario on the broker(s) at ``kafka_bootstrap`` (one, or a replicated cluster:
    tests/e2e/test_kafka_cluster.py)."""
    traces = [trace(i, "p-a") for i in range(30)] + [trace(i, "p-b") for i in range(10)]
    budgeted = [trace(i, "p-c") for i in range(5)]
    malformed: list[tuple[bytes | None, bytes]] = [
        (b"bad-json", b"{not json"), (b"bad-utf8", b"\xff\xfe\x00bad"),
        (b"bad-trace", orjson.dumps({"traceId": "x", "spans": []})),
        (b"too-large", orjson.dumps({**trace(99, "p-a"), "metadata": {"blob": "x" * 5000}}))]
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                      [(t["traceId"].encode(), orjson.dumps(t)) for t in traces + budgeted] + malformed)

        kept = {("a-full", t["traceId"]) for t in traces if t["projectId"] == "p-a"}
        kept |= {("a-half", t["traceId"]) for t in traces
                 if t["projectId"] == "p-a" and reference_keep(t["traceId"], 0.5)}
        kept |= {("b-det", t["traceId"]) for t in traces if t["projectId"] == "p-b"}
        assert 0 < sum(g == "a-half" for g, _ in kept) < 30, "sampling kept some, not all"
        expected_total = len(kept) + 2  # + two budgeted traces (4 calls / 2 judges each)

        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                   until=lambda v: len(v) >= expected_total, settle_s=3)
        dead = await read_topic(kafka_bootstrap, env["SGW_DLQ_TOPIC"], until=lambda v: len(v) >= 4)
        signals = await read_topic(kafka_bootstrap, env["SGW_SIGNALS_TOPIC"], until=lambda v: True, settle_s=1)
        hooks = await read_topic(kafka_bootstrap, env["SGW_WEBHOOKS_TOPIC"], until=lambda v: True, settle_s=1)
        metrics_text = worker.metrics()
    finally:
        code = worker.stop()
    assert code == 0, worker.logs()

    # Every kept (trace, group) rated exactly once, with the hand-computed score.
    counts = Counter(key_of(r) for r in ratings)
    assert max(counts.values()) == 1, [k for k, n in counts.items() if n > 1]
    live = {k for k in counts if k[0] != "c-budget"}
    assert live == kept
    by_key = {key_of(r): r for r in ratings}
    for (group, trace_id), r in by_key.items():
        if group == "c-budget":
            continue
        i = int(trace_id.rsplit("-", 1)[1])
        assert r["rating"] == pytest.approx(expected_score(i, group)), (group, trace_id, r["justification"])
        assert r["kind"] == f"scorer-group:{group}" and r["scope"] == "trace"
        assert r["justification"].startswith("Weighted blend:")
    assert not any(r["groupId"] == "a-session" for r in ratings), "session groups never score at ingest"
    full = by_key[("a-full", "t-p-a-8")]
    assert {m["name"]: m["status"] for m in full["members"]} == {
        "Helpfulness": "scored", "Safety": "scored", "Email": "scored", "Good word": "scored", "External": "scored"}

    # An exhausted budget skips whole groups: 4 calls, 2 judges per trace, 5 traces.
    assert sum(g == "c-budget" for g, _ in counts) == 2
    assert all(len([m for m in r["members"] if m["status"] == "scored"]) == 2
               for r in ratings if r["groupId"] == "c-budget"), "never a partial panel"
    assert 'why="budget"' in metrics_text and worker_metric(metrics_text, "sgw_groups_skipped_total", why="budget") == 3
    # Sampling is counted per (project, group), batch by batch: every kept pair, once.
    for group in ("a-full", "a-half", "b-det"):
        assert worker_metric(metrics_text, "sgw_traces_sampled_in_total", group=group) == sum(g == group for g, _ in kept)

    # Signals exactly for ratings under the threshold; none for a null threshold.
    thresholds = {"a-full": 6, "b-det": 5, "c-budget": 6}
    due = {r["id"] for r in ratings if r["groupId"] in thresholds and r["rating"] is not None
           and r["rating"] < thresholds[r["groupId"]]}
    assert {s["ratingId"] for s in signals} == due and len(signals) == len(due)
    assert all(s["key"] == f"scorer-group:{s['groupId']}" for s in signals)

    # One webhook delivery per Signal and channel of the agent (agent-a has two, agent-b none).
    agent_a_signals = {s["id"] for s in signals if s["agentId"] == "agent-a"}
    assert Counter(h["signalId"] for h in hooks) == {sid: 2 for sid in agent_a_signals}
    assert all("secret" not in orjson.dumps(h).decode() for h in hooks)

    # Malformed records are dead-lettered with their reason and position.
    assert sorted(d["reason"] for d in dead) == ["invalid_trace", "not_json", "not_utf8", "too_large"]
    assert all(d["topic"] == env["SGW_TRACES_TOPIC"] and d["offset"] >= 0 for d in dead)
    bad_utf8 = next(d for d in dead if d["reason"] == "not_utf8")
    assert bad_utf8["valueEncoding"] == "base64"


def worker_metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
