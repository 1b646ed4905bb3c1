"""OTLP reliability: a worker killed with SIGKILL mid-assembly loses no trace and rates none
twice. The assembly buffer is in Redis and offsets are committed only once spans are buffered,
so the worker that takes over finishes every trace: those whose spans were all buffered before
the crash, and those whose root only arrives after it."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import WorkerProcess, produce, read_topic
from tests.support.otlp_records import Telemetry, records, span, trace_hex

BEFORE, BUFFERED, SPLIT = 20, 20, 10  # rated before the crash; buffered at it; root after it
CATALOG = {
    "judges": [{"id": "q", "name": "Quality", "criteria": "Helpful?"}],
    "groups": [{"id": "g", "name": "G", "projectId": "p-k",
                "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low"},
                "members": [{"kind": "judge", "refId": "q", "weight": 1, "gate": False}]}],
}


# env (tests/e2e/conftest.py): a worker's environment with this catalog and these settings
pytestmark = [pytest.mark.integration, pytest.mark.worker(CATALOG, otlp_enabled="true",
                                                          otlp_topic=lambda unique: f"otlp-{unique}", otlp_quiet_s=3,
                                                          otlp_max_wait_s=60, otlp_claim_lease_s=3,
                                                          otlp_flush_interval_s=0.2, claim_lease_s=3,
                                                          member_deadline_s=2, commit_interval_s=0.2)]


def agent_trace(i: int) -> Telemetry:
    t = Telemetry(**{"service.name": "bot", "sgw.project.id": "p-k"})
    with span(t.tracer, "invoke_agent", **{"gen_ai.operation.name": "invoke_agent"}):
        with span(t.tracer, "chat", **{"gen_ai.operation.name": "chat",
                  "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                      {"type": "text", "content": f"answer {i} [[rating={i % 11}]]"}]}])}):
            pass
    return t


async def wait_for(worker: WorkerProcess, metric: str, at_least: float, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while worker.metric(metric) < at_least:
        assert time.monotonic() < deadline, f"{metric} stayed under {at_least}:\n{worker.logs()}"
        await asyncio.sleep(0.1)


async def test_a_worker_killed_mid_assembly_loses_no_trace_and_rates_none_twice(
        env: dict[str, str], kafka_bootstrap: str, tmp_path: Path) -> None:
    traces = [agent_trace(i) for i in range(BEFORE + BUFFERED + SPLIT)]
    expected = {trace_hex(t.spans()[0]): float(i % 11) for i, t in enumerate(traces)}
    topic = env["SGW_OTLP_TOPIC"]
    first = WorkerProcess(env, name="first").start(tmp_path)
    second = WorkerProcess(env, name="second")
    try:
        first.wait_ready()
        await produce(kafka_bootstrap, topic, [r for t in traces[:BEFORE] for r in records(t.spans())])
        await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= BEFORE // 2)
        later = traces[BEFORE:]
        children = [[s for s in t.spans() if s.parent is not None] for t in later[BUFFERED:]]
        await produce(kafka_bootstrap, topic, [r for t in later[:BUFFERED] for r in records(t.spans())]
                      + [r for c in children for r in records(c)])
        buffered_spans = 2 * (BEFORE + BUFFERED) + SPLIT
        await wait_for(first, "sgw_otlp_spans_consumed_total", buffered_spans)
        await asyncio.sleep(0.5)  # past one commit interval: the buffered spans' offsets are committed
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)  # mid-assembly: quiet (3 s) has not passed for the later traces
        first.proc.wait()
        second.start(tmp_path)
        second.wait_ready()
        roots = [[s for s in t.spans() if s.parent is None] for t in later[BUFFERED:]]
        await produce(kafka_bootstrap, topic, [r for root in roots for r in records(root)])
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                   until=lambda v: len({r["traceId"] for r in v}) >= len(expected),
                                   timeout_s=90, settle_s=4)
        traces_topic = await read_topic(kafka_bootstrap, env["SGW_TRACES_TOPIC"], until=lambda v: True, settle_s=0.5)
    finally:
        assert second.stop() == 0, second.logs()

    by_trace: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ratings:
        by_trace[r["traceId"]].append(r)
    assert set(by_trace) == set(expected), "no trace lost"
    for trace_id, published in by_trace.items():
        assert len({r["id"] for r in published}) == 1, f"{trace_id}: rated once (one rating id)"
        assert {r["rating"] for r in published} == {expected[trace_id]}
    emitted = {t["traceId"]: t for t in traces_topic}
    assert all(len(emitted[trace_hex(t.spans()[0])]["spans"]) == 2 for t in later[BUFFERED:]), \
        "a trace whose root came after the crash is assembled whole by the next worker"
    assert all(not emitted[t]["metadata"]["partial"] for t in expected)


async def produce_to(bootstrap: str, topic: str, items: list[tuple[bytes, int]]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, value=v, partition=p) for v, p in items])
    finally:
        await producer.stop()


async def test_two_workers_assemble_traces_whose_spans_they_read_apart(
        env: dict[str, str], kafka_bootstrap: str, tmp_path: Path) -> None:
    """Each trace's children and root go to partitions three apart (of six): with two workers in
    the group, the spans of one trace are read by different workers, and the trace is still
    assembled whole and rated once."""
    traces = [agent_trace(i) for i in range(12)]
    expected = {trace_hex(t.spans()[0]): float(i % 11) for i, t in enumerate(traces)}
    workers = [WorkerProcess(env, name=f"w{n}") for n in range(2)]
    try:
        for w in workers:
            w.start(tmp_path)
        for w in workers:
            w.wait_ready()
        for w in workers:  # the OTLP partitions are shared out between the two
            await wait_for(w, "sgw_otlp_partitions_assigned", 1)
        items = []
        for i, t in enumerate(traces):
            children = [s for s in t.spans() if s.parent is not None]
            root = [s for s in t.spans() if s.parent is None]
            items += [(records(children, by_trace=False)[0][1], i % 6), (records(root, by_trace=False)[0][1], (i + 3) % 6)]
        await produce_to(kafka_bootstrap, env["SGW_OTLP_TOPIC"], items)
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                   until=lambda v: len({r["traceId"] for r in v}) >= len(expected),
                                   timeout_s=90, settle_s=3)
        emitted = await read_topic(kafka_bootstrap, env["SGW_TRACES_TOPIC"], until=lambda v: True, settle_s=0.5)
        both_read = all(w.metric("sgw_otlp_spans_consumed_total") > 0 for w in workers)
    finally:
        for w in workers:
            assert w.stop() == 0, w.logs()

    assert sorted(r["traceId"] for r in ratings) == sorted(expected), "every trace rated, once"
    assert all(r["rating"] == expected[r["traceId"]] for r in ratings)
    assert sorted(t["traceId"] for t in emitted) == sorted(expected), "every trace emitted once"
    assert all(len(t["spans"]) == 2 and not t["metadata"]["partial"] for t in emitted), "assembled whole"
    assert both_read, "both workers read spans: the traces were assembled across workers"
