"""The judge calls behind a live verdict, read back through the API: the exact messages the
local judge received and its answer, with latency, attempts and tokens; a secret in the trace
(the operator's own judge key, sent by a hostile tenant) masked; long texts cut at the bound
with their full length; another project's rating a 404. And exported as GenAI spans over
OTLP/HTTP to a local receiver, parsed as the Collector parses them, linked to the graded trace."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import orjson
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from devtools.judge_server import JudgeServer
from scorer_groups import Client, NotFound
from scorer_groups.api_models import RatingWithCalls
from scoring.judge_calls import CALL_TEXT_MAX_CHARS
from tests.support.api_process import ApiProcess, create_key
from tests.support.harness import WorkerProcess, produce, read_topic, worker_env
from tests.support.http_fakes import Reply, ScriptedServer

pytestmark = pytest.mark.integration

JUDGE_KEY = "sk-operator-judge-key-0f1e2d3c4b5a"


def trace(trace_id: str, output: str) -> tuple[bytes, bytes]:
    value = {"traceId": trace_id, "projectId": "p-calls", "agentId": "bot", "timestamp": "2026-12-05T09:00:00Z",
             "spans": [{"spanId": "r", "parentSpanId": None, "name": "agent.run", "input": "Where is my order?",
                        "output": output}]}
    return trace_id.encode(), orjson.dumps(value)


def exported(collector: ScriptedServer) -> list[Span]:
    return [span for r in collector.requests
            for rs in ExportTraceServiceRequest.FromString(r.body).resource_spans
            for ss in rs.scope_spans for span in ss.spans]


def attributes(span: Span) -> dict[str, object]:
    return {kv.key: getattr(kv.value, str(kv.value.WhichOneof("value"))) for kv in span.attributes}


def kept_result(client: Client, group_id: str, rating_id: str) -> RatingWithCalls:
    """The result once the worker has kept it: it publishes a rating first, then records it."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return client.monitor.scorer_groups.result(group_id, rating_id)
        except NotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def test_a_live_verdicts_judge_calls_are_readable_exactly_cut_and_masked(
        redis_db_url: str, kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    with JudgeServer(api_key=JUDGE_KEY) as judge, ScriptedServer(Reply(200, {})) as collector:
        env = worker_env(kafka_bootstrap, redis_db_url, unique, topic_partitions=1,
                         judge_base_url=judge.base_url, judge_api_key=JUDGE_KEY, judge_trace_export="otlp",
                         judge_trace_endpoint=collector.url + "/v1/traces")
        api = ApiProcess(redis_db_url, tmp_path / "api.log").start()
        worker = WorkerProcess(env).start(tmp_path)
        try:
            worker.wait_ready()
            with Client(api.url, create_key(redis_db_url, "--project", "p-calls")) as client:
                helpful = client.monitor.judges.create(name="Helpful", criteria="Is the answer helpful?")
                group = client.monitor.scorer_groups.create(
                    "Support", members=[{"kind": "judge", "refId": helpful.id, "weight": 1, "label": "Helpfulness"}],
                    online={"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "high"})
                long_output = "It ships today. " + "z" * 9_000 + f" my key is {JUDGE_KEY} [[rating=8]]"
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                              [trace("t-short", "It ships today. [[rating=6]]"), trace("t-long", long_output)])
                ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                           until=lambda v: {r["traceId"] for r in v} >= {"t-short", "t-long"})
                by_trace = {r["traceId"]: r for r in ratings}

                short = kept_result(client, group.id, by_trace["t-short"]["id"])
                assert short.rating.rating == 6.0 and short.rating.trace_id == "t-short"
                (record,) = short.calls
                sent = next(r for r in judge.requests if "It ships today. [[rating=6]]" in str(r["messages"]))
                assert [(m.role, m.content) for m in record.messages] == \
                    [(m["role"], m["content"]) for m in sent["messages"]], "the exact messages the judge received"
                assert all(m.length == len(m.content) for m in record.messages)
                assert (record.ref_id, record.member, record.model) == (helpful.id, "Helpfulness", sent["model"])
                assert record.answer is not None and orjson.loads(record.answer)["rating"] == 6
                assert record.attempts == 1 and record.latency_ms > 0 and record.error is None
                assert record.usage is not None and record.usage.prompt_tokens and record.usage.completion_tokens

                long = kept_result(client, group.id, by_trace["t-long"]["id"])
                user = long.calls[0].messages[1]
                assert len(user.content) == CALL_TEXT_MAX_CHARS and user.length > 9_000, "cut, its length said"
                sent_long = next(r for r in judge.requests if "z" * 100 in str(r["messages"]))
                assert JUDGE_KEY in sent_long["messages"][1]["content"], "the judge itself saw the trace as sent"
                kept = orjson.dumps(long.model_dump(by_alias=True, mode="json")).decode()
                assert JUDGE_KEY not in kept and JUDGE_KEY[:12] not in kept, "the operator's key never comes back"

                with pytest.raises(NotFound):
                    client.monitor.scorer_groups.result(group.id, "00000000-0000-5000-8000-000000000000")

                # The same calls as spans, in the receiver's own format.
                deadline = time.monotonic() + 30
                while len(exported(collector)) < 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                spans = {attributes(s)["sgw.graded.trace_id"]: s for s in exported(collector)}
                short_span = attributes(spans["t-short"])
                assert (short_span["gen_ai.operation.name"], short_span["gen_ai.request.model"],
                        short_span["sgw.rating.id"]) == ("chat", sent["model"], by_trace["t-short"]["id"])
                assert [p["parts"][0]["content"] for p in orjson.loads(str(short_span["gen_ai.input.messages"]))] == \
                    [m["content"] for m in sent["messages"]]
                assert short_span["gen_ai.evaluation.score.value"] == 6.0
                assert all(JUDGE_KEY.encode() not in r.body for r in collector.requests), "masked in spans too"
            with Client(api.url, create_key(redis_db_url, "--project", "p-stranger")) as stranger:
                with pytest.raises(NotFound):
                    stranger.monitor.scorer_groups.result(group.id, by_trace["t-short"]["id"])
        finally:
            worker.stop()
            api.stop()
