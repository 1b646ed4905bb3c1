"""Judge calls as OpenTelemetry spans, so teams see them in their own tracing tool.

Pure: builds an ``ExportTraceServiceRequest``; the exporter is ``consumers.judge_export``. The one rule:
ids are derived from the rating and the call, so exporting the same result twice sends the same span ids.
The span's attributes and links: docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from scoring.frozen import frozen
from scoring.judge_prompt import ANSWER_MAX_TOKENS
from scoring.panel import GroupResult
from scoring.ports import JudgeCall
from scoring.subjects import Subject

SERVICE_NAME = "scorer-group-worker"
SCOPE_NAME = "scorer_group_worker.judges"
PROVIDER = "openai"  # the protocol the judge endpoint speaks: OpenAI chat completions
_HEX32, _HEX16 = re.compile(r"[0-9a-f]{32}"), re.compile(r"[0-9a-f]{16}")


@frozen
class CallSpan:
    """One judge call and what it judged, ready to become a span."""

    call: JudgeCall  # kept: cut and masked
    ref_id: str  # the judge member's scorer id
    member: str  # its label in the group
    score: float | None  # the verdict it gave (0-10), None without one
    group_id: str
    group_name: str
    project_id: str
    rating_id: str
    trace_id: str | None  # the graded trace
    span_id: str | None  # the graded step (span scope), else the trace's root
    index: int  # of the call within the rating: the span's id is derived from it


def export_request(spans: Sequence[CallSpan], service_version: str = "") -> ExportTraceServiceRequest:
    """One OTLP export of ``spans``, under this service's resource and scope."""
    resource = Resource(attributes=[_attr("service.name", SERVICE_NAME)]
                        + ([_attr("service.version", service_version)] if service_version else []))
    scope = ScopeSpans(scope=InstrumentationScope(name=SCOPE_NAME, version=service_version),
                       spans=[_span(s) for s in spans])
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(resource=resource, scope_spans=[scope])])


def _span(s: CallSpan) -> Span:
    call = s.call
    digest = hashlib.sha256(f"judge-call:{s.rating_id}:{s.index}:{call.started_at!r}".encode()).digest()
    start = int(call.started_at * 1e9)
    attributes = [
        _attr("gen_ai.operation.name", "chat"), _attr("gen_ai.provider.name", PROVIDER),
        _attr("gen_ai.system", PROVIDER),  # the name before gen_ai.provider.name, for older backends
        _attr("gen_ai.request.model", call.model), _attr("gen_ai.request.temperature", 0.0),
        _attr("gen_ai.request.max_tokens", ANSWER_MAX_TOKENS),
        _attr("gen_ai.input.messages", orjson.dumps(
            [{"role": role, "parts": [{"type": "text", "content": content}]} for role, content in call.messages]
        ).decode()),
        _attr("gen_ai.evaluation.name", s.member),
        _attr("sgw.scorer_group.id", s.group_id), _attr("sgw.scorer_group.name", s.group_name),
        _attr("sgw.project.id", s.project_id), _attr("sgw.rating.id", s.rating_id),
        _attr("sgw.judge.id", s.ref_id), _attr("sgw.judge.attempts", call.attempts),
    ]
    if call.answer is not None:
        attributes.append(_attr("gen_ai.output.messages", orjson.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": call.answer}]}]).decode()))
    if call.usage is not None:
        if call.usage.prompt_tokens is not None:
            attributes.append(_attr("gen_ai.usage.input_tokens", call.usage.prompt_tokens))
        if call.usage.completion_tokens is not None:
            attributes.append(_attr("gen_ai.usage.output_tokens", call.usage.completion_tokens))
    if s.score is not None:
        attributes.append(_attr("gen_ai.evaluation.score.value", float(s.score)))
    if s.trace_id is not None:
        attributes.append(_attr("sgw.graded.trace_id", s.trace_id))
    status = Status(code=Status.STATUS_CODE_OK)
    if call.error is not None:
        attributes.append(_attr("error.type", "judge_error"))
        status = Status(code=Status.STATUS_CODE_ERROR, message=call.error)
    links = [] if s.trace_id is None else [Span.Link(trace_id=_sized(s.trace_id, _HEX32, 16),
                                                     span_id=_sized(s.span_id or s.trace_id, _HEX16, 8))]
    return Span(trace_id=digest[:16], span_id=digest[16:24], name=f"chat {call.model}", kind=Span.SPAN_KIND_CLIENT,
                start_time_unix_nano=start, end_time_unix_nano=start + int(call.latency_s * 1e9),
                attributes=attributes, links=links, status=status)


def _sized(value: str, hex_form: re.Pattern[str], size: int) -> bytes:
    """An id as OTLP's bytes: its own when it is OTLP's hex, else a hash of it of that size."""
    lowered = value.lower()
    if hex_form.fullmatch(lowered):
        return bytes.fromhex(lowered)
    return hashlib.sha256(value.encode()).digest()[:size]


def _attr(key: str, value: str | int | float) -> KeyValue:
    if isinstance(value, bool) or isinstance(value, str):
        any_value = AnyValue(string_value=str(value))
    elif isinstance(value, int):
        any_value = AnyValue(int_value=value)
    else:
        any_value = AnyValue(double_value=value)
    return KeyValue(key=key, value=any_value)


def call_spans(result: GroupResult, rating_id: str) -> list[CallSpan]:
    """The spans of a result's judge calls (none when its judges made no call)."""
    group, subject = result.group, result.subject
    graded_span = subject.span_id or _root_span_id(subject)
    spans: list[CallSpan] = []
    for member in result.blend.members:
        o = member.outcome
        for call in o.calls:
            score = float(o.native) if o.goodness is not None and isinstance(o.native, int | float) else None
            spans.append(CallSpan(call, o.ref_id, o.name, score, group.id, group.name, group.project_id, rating_id,
                                  subject.trace_id, graded_span, len(spans)))
    return spans


def _root_span_id(subject: Subject) -> str | None:
    for span in subject.spans:
        parent, span_id = ((span.get("parentSpanId"), span.get("spanId")) if isinstance(span, dict)
                           else (span.parent_span_id, span.span_id))
        if not parent:
            return span_id if isinstance(span_id, str) else None
    return None
