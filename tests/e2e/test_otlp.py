"""OpenTelemetry in, end to end: records exactly as the Collector's Kafka exporter writes them
(real SDK spans through the SDK's OTLP encoder, protobuf and JSON, keyed by trace id or not), a
real worker on the real broker and Redis assembling them into traces and rating each with the
expected group and value: a GenAI-conventions agent trace, an OpenInference trace, a multi-turn
session with empty roots, one request holding several traces, one trace split over requests
and partitions, a trace whose root never ends (partial, by max wait); malformed and projectless
records dead-lettered with the reason; late spans counted and never rated twice."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from devtools.judge_server import JudgeServer
from tests.support.harness import WorkerProcess, read_topic
from tests.support.otlp_records import Telemetry, records, span, trace_hex

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "high"}
CATALOG = {
    "judges": [{"id": "quality", "name": "Quality", "criteria": "Helpful?"}],
    "patterns": [{"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology"}],
    "groups": [
        {"id": "otel-trace", "name": "Agent quality", "projectId": "p-otel", "online": ONLINE,
         "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": False},
                     {"kind": "pattern", "refId": "apology", "weight": 0, "gate": True}]},
        # Span scope: the chat steps of the assembled traces, each graded on its own.
        {"id": "otel-steps", "name": "Chat steps", "projectId": "p-otel",
         "online": {**ONLINE, "scope": "span",
                    "spanFilter": {"field": "attributes.gen_ai.operation.name", "op": "eq", "value": "chat"}},
         "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": False}]},
        {"id": "otel-session", "name": "Conversation", "projectId": "p-conv",
         "online": {**ONLINE, "scope": "session", "idleSeconds": 1},
         "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": False},
                     {"kind": "pattern", "refId": "apology", "weight": 0, "gate": True}]},
    ],
}
RESOURCE = {"service.name": "support-bot", "sgw.project.id": "p-otel"}
MAX_WAIT_S = 4


def messages(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])


def genai_agent_trace() -> Telemetry:
    t = Telemetry(**RESOURCE)
    with span(t.tracer, "invoke_agent Helper", **{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "Helper"}):
        with span(t.tracer, "execute_tool get_weather", **{"gen_ai.operation.name": "execute_tool",
                  "gen_ai.tool.call.result": "sorry: cache miss, fetched live"}):
            pass
        with span(t.tracer, "chat gpt-4o", **{"gen_ai.operation.name": "chat",
                  "gen_ai.input.messages": messages("user", "Weather in Paris?"),
                  "gen_ai.output.messages": messages("assistant", "It is raining in Paris. [[rating=8]]")}):
            pass
    return t


def openinference_trace() -> Telemetry:
    t = Telemetry(**RESOURCE)
    with span(t.tracer, "Agent", **{"openinference.span.kind": "AGENT", "input.value": "Book a table",
              "output.value": "Booked for 8pm. [[rating=6]]"}):
        with span(t.tracer, "book", **{"openinference.span.kind": "TOOL", "output.value": "sorry, retried once"}):
            pass
    return t


def session_turns() -> list[Telemetry]:
    turns = []
    for user, tool, agent in [("Sorry to bother you, where is my order?", "Sorry, no row found", "It ships today."),
                              ("Thanks!", "ok", "You're welcome. [[rating=7]]")]:
        t = Telemetry(**{**RESOURCE, "sgw.project.id": "p-conv"})
        with span(t.tracer, "invoke_agent", **{"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "conv-otel"}):
            with span(t.tracer, "execute_tool lookup", **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.result": tool}):
                pass
            with span(t.tracer, "chat", **{"gen_ai.operation.name": "chat", "gen_ai.input.messages": messages("user", user),
                      "gen_ai.output.messages": messages("assistant", agent)}):
                pass
        turns.append(t)
    return turns


def plain_traces(values: list[int]) -> Telemetry:
    t = Telemetry(**RESOURCE)
    for v in values:
        with span(t.tracer, "run", **{"input.value": f"question {v}", "output.value": f"answer [[rating={v}]]"}):
            pass
    return t


def split_trace() -> Telemetry:
    t = Telemetry(**RESOURCE)
    with span(t.tracer, "run", **{"input.value": "question", "output.value": "the whole answer [[rating=9]]"}):
        with span(t.tracer, "chat", **{"gen_ai.operation.name": "chat", "gen_ai.output.messages": messages("assistant", "draft [[rating=1]]")}):
            pass
    return t


def rootless_trace() -> Telemetry:
    t = Telemetry(**RESOURCE)
    with span(t.tracer, "invoke_agent", **{"gen_ai.operation.name": "invoke_agent"}):
        with span(t.tracer, "chat", **{"gen_ai.operation.name": "chat",
                  "gen_ai.output.messages": messages("assistant", "partial answer [[rating=4]]")}):
            pass
    return t


async def produce(bootstrap: str, topic: str, items: list[tuple[bytes | None, bytes, int | None]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_request_size=4 << 20)
    await producer.start()
    try:
        acks = [await producer.send(topic, key=k, value=v, partition=p) for k, v, p in items]
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer(default_rating=5) as s:
        yield s


# env (tests/e2e/conftest.py): a worker's environment with this catalog and these settings
pytestmark = [pytest.mark.integration, pytest.mark.worker(CATALOG, otlp_enabled="true",
                                                          otlp_topic=lambda unique: f"otlp-{unique}",
                                                          otlp_quiet_s=0.5, otlp_max_wait_s=MAX_WAIT_S,
                                                          otlp_flush_interval_s=0.2, session_sweep_interval_s=0.3,
                                                          commit_interval_s=0.2)]


async def test_collector_records_are_assembled_and_rated_once_each(env: dict[str, str], kafka_bootstrap: str,
                                                                    tmp_path: Path) -> None:
    genai, oi, turns = genai_agent_trace(), openinference_trace(), session_turns()
    several, split, rootless = plain_traces([3, 4, 5]), split_trace(), rootless_trace()
    split_root = [s for s in split.spans() if s.parent is None]
    split_children = [s for s in split.spans() if s.parent is not None]
    no_project = Telemetry(**{"service.name": "anonymous"})
    with span(no_project.tracer, "run", **{"output.value": "who am I"}):
        pass
    topic = env["SGW_OTLP_TOPIC"]
    items: list[tuple[bytes | None, bytes, int | None]] = []
    items += [(k, v, None) for k, v in records(genai.spans())]  # otlp_proto keyed by trace id
    items += [(k, v, None) for k, v in records(oi.spans(), encoding="otlp_json", by_trace=False)]
    for turn in turns:
        items += [(k, v, None) for k, v in records(turn.spans(), encoding="otlp_json")]
    items += [(k, v, None) for k, v in records(several.spans(), by_trace=False)]  # one request, three traces
    items += [(None, records(split_children, by_trace=False)[0][1], 0),  # one trace over two requests and partitions
              (None, records(split_root, encoding="otlp_json", by_trace=False)[0][1], 1)]
    items += [(k, v, None) for k, v in records([s for s in rootless.spans() if s.parent is not None])]
    items += [(k, v, None) for k, v in records(no_project.spans())]
    items += [(b"junk", b"\x0a\xff\xff\xff not a request", None)]

    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, topic, items)
        trace_ids = {"genai": trace_hex(genai.spans()[0]), "oi": trace_hex(oi.spans()[0]),
                     "split": trace_hex(split_root[0]), "rootless": trace_hex(rootless.spans()[0]),
                     **{f"several-{i}": trace_hex(s) for i, s in enumerate(several.spans())}}
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=60, settle_s=2,
                                   until=lambda v: len(v) >= len(trace_ids) + 1)
        # Late: the exporter retries a request of a trace already rated.
        await produce(kafka_bootstrap, topic, [(k, v, None) for k, v in records(genai.spans())])
        deadline = asyncio.get_running_loop().time() + 20
        while worker.metric("sgw_otlp_late_spans_total") < len(genai.spans()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.3)
        late = worker.metric("sgw_otlp_late_spans_total")
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: True, settle_s=2)
        headed = await read_topic(kafka_bootstrap, env["SGW_TRACES_TOPIC"], until=lambda v: True, settle_s=0.5,
                                  keep=lambda r: (orjson.loads(r.value), {k: v.decode() for k, v in r.headers}))
        traces, headers = [t for t, _ in headed], [h for _, h in headed]
        dead = await read_topic(kafka_bootstrap, env["SGW_DLQ_TOPIC"], until=lambda v: len(v) >= 2, timeout_s=20)
        assembled = {how: worker.metric("sgw_otlp_traces_assembled_total", how=how) for how in ("complete", "timeout")}
        consumed = worker.metric("sgw_otlp_spans_consumed_total")
    finally:
        assert worker.stop() == 0, worker.logs()

    by_trace = {r["traceId"]: r for r in ratings if r["scope"] == "trace"}
    counts = Counter((r["groupId"], r.get("traceId") or r.get("sessionId"), r.get("spanId")) for r in ratings)
    assert max(counts.values()) == 1, f"every trace, step and session rated once: {counts}"
    steps = [r for r in ratings if r["scope"] == "span" and r["traceId"] == trace_ids["genai"]]
    assert [(r["groupId"], r["spanName"], r["rating"]) for r in steps] == [("otel-steps", "chat gpt-4o", 8.0)], \
        "spans assembled from the Collector are graded by span-scope groups: the chat step, not the tool"
    expected = {"genai": 8.0, "oi": 6.0, "split": 9.0, "rootless": 4.0, "several-0": 3.0, "several-1": 4.0,
                "several-2": 5.0}
    assert {name: by_trace[t]["rating"] for name, t in trace_ids.items()} == expected, \
        "tool spans never zero a group; the split trace is rated whole (root's answer); the rootless one by max wait"
    assert all(by_trace[t]["groupId"] == "otel-trace" and by_trace[t]["projectId"] == "p-otel" for t in trace_ids.values())
    assert by_trace[trace_ids["genai"]]["agentId"] == "Helper"
    (session,) = [r for r in ratings if r["scope"] == "session"]
    assert (session["groupId"], session["sessionId"], session["turns"], session["rating"]) == \
        ("otel-session", "conv-otel", 2, 7.0), "the user's and the tool's apologies are not the agent's words"
    assert not any(r["scope"] == "trace" and r["projectId"] == "p-conv" for r in ratings)

    emitted = {t["traceId"]: t for t in traces}
    assert emitted[trace_ids["rootless"]]["metadata"]["partial"] is True
    assert emitted[trace_ids["rootless"]]["metadata"]["assembly"] == "max_wait"
    assert emitted[trace_ids["genai"]]["metadata"] == {**emitted[trace_ids["genai"]]["metadata"], "partial": False,
                                                       "assembly": "quiet", "source": "otlp"}
    assert len(emitted[trace_ids["split"]]["spans"]) == 2
    assert Counter(t["traceId"] for t in traces).most_common(1)[0][1] == 1, "each trace emitted once"
    # Each with its routing headers: a trace no live group wants is skipped before it is parsed.
    for trace, routing in zip(traces, headers, strict=True):
        assert routing == {"sgw-project": trace["projectId"], "sgw-agent": trace["agentId"], "sgw-trace": trace["traceId"],
                           "sgw-root-name": next(s.get("name", "") for s in trace["spans"] if not s.get("parentSpanId")),
                           **({"sgw-session": trace["sessionId"]} if trace.get("sessionId") else {})}

    assert sorted(d["reason"] for d in dead) == ["no_project", "not_otlp"]
    assert "sgw.project.id" in next(d["error"] for d in dead if d["reason"] == "no_project")
    assert late >= len(genai.spans())
    assert assembled["timeout"] >= 1 and assembled["complete"] >= len(trace_ids) - 1 + len(turns)
    assert consumed >= sum(len(x.spans()) for x in (genai, oi, several, split, *turns))
