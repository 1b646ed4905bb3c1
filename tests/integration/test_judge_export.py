"""Judge calls exported as OpenTelemetry spans: the export is what an OTLP/HTTP receiver (the
Collector's own protobuf format) parses - GenAI attributes, the messages, the verdict, a link to
the graded trace and step - and the exporter is telemetry that never grows nor blocks: a full
queue drops its oldest, a 503 is tried once more, a refusal drops the batch, all counted. The
receiver is a real local HTTP server."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from consumers.judge_export import JudgeCallExporter
from scoring.otlp.judge_spans import CallSpan, export_request
from scoring.ports import JudgeCall, TokenUsage
from tests.support.http_fakes import Reply, ScriptedServer

GRADED_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"  # OTLP hex: linked as is
GRADED_SPAN = "00f067aa0ba902b7"


def call_span(n: int = 0, *, error: str | None = None, trace_id: str | None = GRADED_TRACE,
              span_id: str | None = GRADED_SPAN) -> CallSpan:
    call = JudgeCall("judge-model", (("system", "You grade."), ("user", f"Criteria: helpful? #{n}")),
                     None if error else '{"rating": 8, "justification": "fine"}', 1_796_000_000.5, 0.75, 2,
                     TokenUsage(120, 9), error)
    return CallSpan(call, "jdg_1", "Helpfulness", None if error else 8.0, "grp_1", "Support", "p-1", f"r-{n}",
                    trace_id, span_id, 0)


def attributes(span: Span) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind)
    return out


def test_a_judge_call_is_a_genai_chat_span_linked_to_the_graded_trace() -> None:
    parsed = ExportTraceServiceRequest.FromString(export_request([call_span()], "0.2.0").SerializeToString())
    (resource_spans,) = parsed.resource_spans
    assert {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes} == {
        "service.name": "scorer-group-worker", "service.version": "0.2.0"}
    (span,) = resource_spans.scope_spans[0].spans
    a = attributes(span)
    assert span.name == "chat judge-model" and span.kind == Span.SPAN_KIND_CLIENT
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.request.model"]) == \
        ("chat", "openai", "judge-model")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (120, 9)
    assert json.loads(str(a["gen_ai.input.messages"])) == [
        {"role": "system", "parts": [{"type": "text", "content": "You grade."}]},
        {"role": "user", "parts": [{"type": "text", "content": "Criteria: helpful? #0"}]}]
    assert json.loads(str(a["gen_ai.output.messages"]))[0]["parts"][0]["content"].startswith('{"rating": 8')
    assert (a["gen_ai.evaluation.name"], a["gen_ai.evaluation.score.value"]) == ("Helpfulness", 8.0)
    assert (a["sgw.scorer_group.id"], a["sgw.rating.id"], a["sgw.judge.attempts"]) == ("grp_1", "r-0", 2)
    assert span.end_time_unix_nano - span.start_time_unix_nano == 750_000_000
    (link,) = span.links
    assert (link.trace_id.hex(), link.span_id.hex()) == (GRADED_TRACE, GRADED_SPAN)
    assert span.status.code == span.status.STATUS_CODE_OK
    again = ExportTraceServiceRequest.FromString(export_request([call_span()]).SerializeToString())
    assert again.resource_spans[0].scope_spans[0].spans[0].span_id == span.span_id, "a re-export, the same ids"


def test_a_failed_call_is_an_error_span_and_a_trace_id_of_any_shape_still_links() -> None:
    request = export_request([call_span(error="judge answer is not a JSON object", trace_id="order-42", span_id="r")])
    span = request.resource_spans[0].scope_spans[0].spans[0]
    a = attributes(span)
    assert span.status.code == span.status.STATUS_CODE_ERROR and a["error.type"] == "judge_error"
    assert "gen_ai.output.messages" not in a and "gen_ai.evaluation.score.value" not in a
    assert a["sgw.graded.trace_id"] == "order-42"
    assert len(span.links[0].trace_id) == 16 and len(span.links[0].span_id) == 8, "hashed to OTLP's sizes"


async def test_the_exporter_sends_batches_and_counts_what_it_could_not() -> None:
    with ScriptedServer(Reply(200, {})) as receiver:
        exporter = JudgeCallExporter(receiver.url + "/v1/traces", headers={"x-api-key": "k"}, batch=3,
                                     interval_s=0.05, max_queued=5)
        stop = asyncio.Event()
        running = asyncio.create_task(exporter.run(stop))
        exporter.add(call_span(n) for n in range(4))
        await _until(lambda: exporter.sent == 4)
        assert [len(_spans(r.body)) for r in receiver.requests] == [3, 1], "a full batch at once, the rest on time"
        assert receiver.requests[0].headers["content-type"] == "application/x-protobuf"
        assert receiver.requests[0].headers["x-api-key"] == "k" and receiver.requests[0].path == "/v1/traces"

        receiver.script(Reply(503, {}), Reply(200, {}))  # away a moment: tried once more
        exporter.add([call_span(10)])
        await _until(lambda: exporter.sent == 5)
        receiver.script(Reply(400, {}))  # refused: dropped at once, counted
        exporter.add([call_span(11)])
        await _until(lambda: exporter.failed == 1)

        stop.set()
        await running
    exporter.add([call_span(20)])  # after the stop: nothing will send it, and it is said so
    assert exporter.dropped == 1

    bounded = JudgeCallExporter("http://127.0.0.1:9/v1/traces", max_queued=5, max_queued_chars=10_000)
    bounded.add(call_span(n) for n in range(7))  # a queue of 5 spans: the 2 oldest dropped
    assert bounded.dropped == 2
    huge = dataclasses.replace(call_span(99), call=dataclasses.replace(call_span(99).call, answer="x" * 9_900))
    bounded.add([huge])  # 10,000 characters at most: everything older goes first
    assert bounded.dropped == 7


def _spans(body: bytes) -> list[Span]:
    return list(ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans)


async def _until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "not in time"
        await asyncio.sleep(0.02)
