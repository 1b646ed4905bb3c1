"""Span scope in the live worker (subprocesses on the real broker and Redis, judges through the
local judge server): a group grades exactly the steps of a trace its ``spanFilter`` takes - each
judge call reserved, each step rated once under its span id, through a redelivery, a SIGKILL and
a rebalance - a pattern group on tool spans fires on the tool's leak and not on the answer, and
the per-trace cap holds on a 5,000-span trace."""

from __future__ import annotations

import signal
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.stores.claims import Claims
from devtools.judge_server import Behaviour, JudgeServer
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

PROJECT = "p-span"
ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high", "scope": "span"}
LLM_STEPS = {"any": [{"field": "attributes.gen_ai.operation.name", "op": "eq", "value": "chat"},
                     {"field": "attributes.openinference.span.kind", "op": "eq", "value": "LLM"}]}
CATALOG: dict[str, Any] = {
    "judges": [{"id": "step", "name": "Step quality", "criteria": "Is this step's output right for its input?"}],
    "patterns": [{"id": "email", "name": "Email", "polarity": "failure", "template": "email"}],
    "groups": [
        {"id": "llm-steps", "name": "LLM steps", "projectId": PROJECT, "online": {**ONLINE, "spanFilter": LLM_STEPS},
         "members": [{"kind": "judge", "refId": "step", "weight": 1}]},
        {"id": "tool-leaks", "name": "Tool leaks", "projectId": PROJECT,
         "online": {**ONLINE, "spanFilter": {"field": "kind", "op": "eq", "value": "tool"}},
         "members": [{"kind": "pattern", "refId": "email", "weight": 1, "gate": True}]}],
    "budgets": [{"projectId": PROJECT, "judgeCallsPerWindow": 100_000, "windowSeconds": 86_400}],
}


def agent_trace(name: str) -> dict[str, Any]:
    """A retrieval, two LLM calls (GenAI and OpenInference conventions), a tool that leaks an
    email, and the final answer (which leaks nothing)."""
    return {"traceId": name, "projectId": PROJECT, "agentId": "support", "timestamp": "2026-12-05T10:00:00Z",
            "spans": [
                {"spanId": "root", "name": "agent.run", "input": "Where is my order?", "output": "It ships today."},
                {"spanId": "ret", "parentSpanId": "root", "name": "search docs", "kind": "retriever",
                 "input": "order status", "output": "Orders ship in 2 days."},
                {"spanId": "llm-1", "parentSpanId": "root", "name": "chat gpt-4o", "kind": "llm",
                 "attributes": {"gen_ai.operation.name": "chat"}, "input": "plan",
                 "output": f"I will look the order up [[rating=7]] [[key={name}/llm-1]]"},
                {"spanId": "tool", "parentSpanId": "llm-1", "name": "lookup_customer", "kind": "tool",
                 "input": {"id": 7}, "output": "customer jane@example.com, order 7 packed"},
                {"spanId": "llm-2", "parentSpanId": "root", "name": "answer", "kind": "llm",
                 "attributes": {"openinference.span.kind": "LLM"}, "input": "write the answer",
                 "output": f"It ships today [[rating=4]] [[key={name}/llm-2]]"}]}


def many_tools(name: str, spans: int) -> dict[str, Any]:
    return {"traceId": name, "projectId": PROJECT, "agentId": "support", "timestamp": "2026-12-05T10:00:00Z",
            "spans": [{"spanId": "root", "name": "agent.run", "input": "q", "output": "a"}]
            + [{"spanId": f"t{i}", "parentSpanId": "root", "name": "t", "kind": "tool", "output": "ok"}
               for i in range(spans)]}


def record(trace: dict[str, Any]) -> tuple[bytes, bytes]:
    return trace["traceId"].encode(), orjson.dumps(trace)


@pytest.fixture
async def catalog_url(redis_db_url: str) -> AsyncIterator[str]:
    async with catalog_db(redis_db_url, CATALOG) as url:
        yield url


async def test_span_groups_grade_exactly_their_steps_once_each_and_the_cap_holds(
        catalog_url: str, kafka_bootstrap: str, unique: str, judge: JudgeServer, tmp_path: Path) -> None:
    env = worker_env(kafka_bootstrap, catalog_url, unique, judge_base_url=judge.base_url, judge_timeout_s=5,
                     commit_interval_s=0.2, max_spans_per_trace=20)
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [record(agent_trace("t-1"))])
        first = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 3, settle_s=1)
        # Redelivered (a producer retry, a replay): nothing is graded or spent again.
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [record(agent_trace("t-1")), record(many_tools("t-big", 5000))])
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 23, settle_s=2)
        signals = await read_topic(kafka_bootstrap, env["SGW_SIGNALS_TOPIC"], until=lambda v: len(v) >= 2, settle_s=1)
        redis = connect(env["SGW_REDIS_URL"])
        spent = await Claims(redis).budget_used(PROJECT, 86_400)
        await redis.aclose()
        metrics_text = worker.metrics()
    finally:
        assert worker.stop() == 0, worker.logs()

    steps = sorted((r["groupId"], r["spanId"], r["spanName"], r["rating"]) for r in first)
    assert steps == [("llm-steps", "llm-1", "chat gpt-4o", 7.0), ("llm-steps", "llm-2", "answer", 4.0),
                     ("tool-leaks", "tool", "lookup_customer", 0.0)], "exactly the steps each group aims at"
    assert all(r["scope"] == "span" and r["traceId"] == "t-1" for r in first)
    assert judge.calls_by_key == {"t-1/llm-1": 1, "t-1/llm-2": 1}, "one judge call per LLM step, and no more"
    assert spent == 2, "each judge call reserved from the project's budget"
    one_trace = [r for r in ratings if r["traceId"] == "t-1"]
    assert sorted(r["id"] for r in one_trace) == sorted(r["id"] for r in first), "the redelivery rated nothing again"

    big = [r for r in ratings if r["traceId"] == "t-big"]
    assert len(big) == 20 and {r["spanId"] for r in big} == {f"t{i}" for i in range(20)}, "the first 20 steps"
    capped = metric(metrics_text, "sgw_groups_skipped_total", group="tool-leaks", why="span_cap")
    assert capped == 4980, "the spans past the cap are counted"

    leak = [s for s in signals if s["spanId"] == "tool"]
    assert len(leak) == 1 and leak[0]["groupId"] == "tool-leaks" and leak[0]["spanName"] == "lookup_customer"
    assert not [s for s in signals if s["groupId"] == "tool-leaks" and s["spanId"] != "tool"], \
        "the final answer is not a tool step: no Signal for it"
    (asked,) = [r["messages"][-1]["content"] for r in judge.requests if "[[key=t-1/llm-2]]" in r["messages"][-1]["content"]]
    assert "Where is my order?" in asked and "write the answer" in asked and 'llm span "answer"' in asked, \
        "the step, its kind and name, with the trace's request as context"


TRACES = 40  # x 2 LLM steps


@pytest.mark.parametrize("joiners", [2])
async def test_sigkill_and_a_rebalance_mid_trace_leave_one_rating_per_step(
        catalog_url: str, kafka_bootstrap: str, unique: str, judge: JudgeServer, tmp_path: Path, joiners: int) -> None:
    judge.set_default(Behaviour.deterministic(delay=0.05))  # slow enough to be caught mid-trace
    env = worker_env(kafka_bootstrap, catalog_url, unique, judge_base_url=judge.base_url, max_in_flight=8,
                     claim_lease_s=3, member_deadline_s=2, commit_interval_s=0.5)
    first = WorkerProcess(env, name="first").start(tmp_path)
    others = [WorkerProcess(env, name=f"joiner-{n}") for n in range(joiners)]
    try:
        first.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [record(agent_trace(f"k-{i}")) for i in range(TRACES)])
        await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= TRACES // 2)
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)  # no drain, no commit, leases left behind
        first.proc.wait()
        for worker in others:  # two join at once: the partitions are split between them
            worker.start(tmp_path)
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=120, settle_s=4,
                                   until=lambda v: len({(r["traceId"], r["spanId"]) for r in v}) >= 3 * TRACES)
    finally:
        for worker in others:
            assert worker.stop() == 0, worker.logs()

    by_step: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in ratings:
        by_step[(r["groupId"], r["traceId"], r["spanId"])].append(r)
    assert set(by_step) == {(g, f"k-{i}", s) for i in range(TRACES)
                            for g, s in (("llm-steps", "llm-1"), ("llm-steps", "llm-2"), ("tool-leaks", "tool"))}
    for step, published in by_step.items():
        assert len({r["id"] for r in published}) == 1, f"{step}: one rating id"
        assert len({r["rating"] for r in published}) == 1, f"{step}: never a different rating"


def metric(text: str, name: str, **labels: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()))
