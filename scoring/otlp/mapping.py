"""OpenTelemetry spans in the trace model: ``decode_request``, ``buffered_spans``, ``assemble``.

One request may hold spans of many traces, and one trace may be spread over many requests, hence three
steps. The one rule: spans without a project are reported, never guessed. How the conventions map is
``scoring.otlp.conventions``. The steps: docs/design-notes.md.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from scoring.errors import ScoringError
from scoring.otlp.conventions import CONTENT_ATTRIBUTES, span_content, span_kind
from scoring.subjects import Span, Trace

MAX_VALUE_DEPTH = 8  # nesting kept of one attribute value (deeper parts become a marker)
MAX_ITEMS = 256  # items kept of one array or key-value list attribute
MAX_ATTRIBUTES = 128  # attributes kept per span (after the content attributes are read)
MAX_EVENTS = 64  # events read per span
MAX_JSON_DEPTH = 128  # nesting of an OTLP/JSON document (the protobuf parser has its own limit)
PLACEHOLDER_ROOT = "(root span not received)"
_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


class OtlpError(ValueError, ScoringError):
    """A record that is not an OTLP trace request, or spans that cannot be taken; ``reason`` is
    the dead-letter reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class MappingRules:
    """Where project and session come from (``SGW_OTLP_*`` settings)."""

    project_attribute: str = "sgw.project.id"
    default_project: str = ""  # used when neither the resource nor the span names a project
    session_attribute: str = ""  # a further attribute read after the conventions' own


class BufferedSpan(BaseModel):
    """One span, mapped, as it waits in the assembly buffer for the rest of its trace."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    trace_id: str
    project_id: str = Field(min_length=1, max_length=128)
    span: Span
    agent: str | None = None  # gen_ai.agent.id / gen_ai.agent.name on the span or resource
    service: str | None = None  # the resource's service.name
    session: str | None = None

    @property
    def is_root(self) -> bool:
        return not self.span.parent_span_id


@dataclass(frozen=True)
class Rejected:
    """Spans of a request that could not be buffered, and why."""

    reason: str
    trace_id: str
    error: str


# --- 1. decoding ----------------------------------------------------------------------------------

def decode_request(value: bytes, encoding: str = "auto") -> ExportTraceServiceRequest:
    """The request in a record: ``otlp_json`` when it is a JSON object (or so configured),
    else ``otlp_proto``. A protobuf request never starts with ``{`` (that byte would be a
    group tag of field 15, which the request does not have)."""
    json_like = value.lstrip()[:1] == b"{"
    if encoding == "otlp_json" or (encoding == "auto" and json_like):
        return _from_json(value)
    try:
        request: ExportTraceServiceRequest = ExportTraceServiceRequest.FromString(value)
        return request
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise OtlpError("not_otlp", f"not an OTLP protobuf ExportTraceServiceRequest: {exc}") from exc


def _from_json(value: bytes) -> ExportTraceServiceRequest:
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise OtlpError("not_otlp", f"not OTLP/JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise OtlpError("not_otlp", "OTLP/JSON must be an object with resourceSpans")
    if _depth(document, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise OtlpError("not_otlp", f"OTLP/JSON nested deeper than {MAX_JSON_DEPTH} levels")
    _hex_ids_to_base64(document)
    try:
        request: ExportTraceServiceRequest = json_format.ParseDict(document, ExportTraceServiceRequest(),
                                                                   ignore_unknown_fields=True)
        return request
    except (json_format.ParseError, RecursionError, ValueError, TypeError) as exc:
        raise OtlpError("not_otlp", f"not an OTLP/JSON ExportTraceServiceRequest: {exc}") from exc


def _depth(value: Any, limit: int, level: int = 0) -> int:
    if level > limit:
        return level
    if isinstance(value, dict):
        return max((_depth(v, limit, level + 1) for v in value.values()), default=level)
    if isinstance(value, list):
        return max((_depth(v, limit, level + 1) for v in value), default=level)
    return level


def _hex_ids_to_base64(document: dict[str, Any]) -> None:
    """OTLP/JSON writes trace and span ids in hex; protobuf's JSON mapping reads bytes as base64."""
    def fix(obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        for name in _ID_FIELDS:
            raw = obj.get(name)
            if isinstance(raw, str) and raw and len(raw) % 2 == 0:
                try:
                    obj[name] = base64.b64encode(bytes.fromhex(raw)).decode()
                except ValueError:
                    pass  # not hex: left for the parser to judge
        for link in obj.get("links") or []:
            fix(link)

    for resource_spans in _items(document, "resourceSpans", "resource_spans"):
        for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
            for span in _items(scope_spans, "spans"):
                fix(span)


def _items(obj: Any, *names: str) -> list[Any]:
    if not isinstance(obj, dict):
        return []
    for name in names:
        value = obj.get(name)
        if isinstance(value, list):
            return value
    return []


# --- 2. spans -------------------------------------------------------------------------------------

def attribute_value(value: AnyValue, depth: int = 0) -> Any:
    """An OTLP ``AnyValue`` as plain data, bounded in depth and width."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        return getattr(value, kind)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode()
    if depth >= MAX_VALUE_DEPTH:
        return "[nested too deep]"
    if kind == "array_value":
        return [attribute_value(v, depth + 1) for v in value.array_value.values[:MAX_ITEMS]]
    return attributes(value.kvlist_value.values[:MAX_ITEMS], depth + 1)


def attributes(pairs: Any, depth: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in pairs:
        out[kv.key] = attribute_value(kv.value, depth)
    return out


def _time(unix_nano: int) -> datetime | None:
    return datetime.fromtimestamp(unix_nano / 1e9, tz=UTC) if unix_nano > 0 else None


def _text_attr(*sources: dict[str, Any], names: tuple[str, ...], limit: int = 256) -> str | None:
    """The first of ``names`` set in ``sources``, as text cut to the trace model's limit."""
    for source in sources:
        for name in names:
            value = source.get(name) if name else None
            if value not in (None, ""):
                return str(value)[:limit]
    return None


def _hex_id(raw: bytes, size: int) -> str | None:
    if len(raw) != size or not any(raw):
        return None
    return binascii.hexlify(raw).decode()


def buffered_spans(request: ExportTraceServiceRequest,
                   rules: MappingRules) -> tuple[list[BufferedSpan], list[Rejected]]:
    """Every span of ``request`` mapped, and those that cannot be taken (no project, bad ids)."""
    taken: list[BufferedSpan] = []
    rejected: list[Rejected] = []
    for resource, otel_span in _spans(request):
        span_attrs = attributes(otel_span.attributes)
        trace_id = _hex_id(otel_span.trace_id, 16)
        span_id = _hex_id(otel_span.span_id, 8)
        if trace_id is None or span_id is None:
            rejected.append(Rejected("invalid_span", binascii.hexlify(otel_span.trace_id).decode(),
                                     "a span needs a 16-byte trace id and an 8-byte span id, not all zero"))
            continue
        project = _text_attr(resource, span_attrs, names=(rules.project_attribute,), limit=129) or rules.default_project
        if not project or len(project) > 128:
            rejected.append(Rejected("no_project", trace_id,
                                     f"no project: neither the resource nor the span has the attribute "
                                     f"{rules.project_attribute!r} (1-128 characters) and no default is set"))
            continue
        try:
            taken.append(BufferedSpan(
                trace_id=trace_id, project_id=project, span=_span(otel_span, span_id, span_attrs),
                agent=_text_attr(span_attrs, resource, names=("gen_ai.agent.id", "gen_ai.agent.name"), limit=128),
                service=_text_attr(resource, names=("service.name",), limit=128),
                session=_text_attr(span_attrs, resource, names=("gen_ai.conversation.id", "session.id",
                                                                rules.session_attribute)),
            ))
        except (ValidationError, ValueError, TypeError, OverflowError) as exc:
            rejected.append(Rejected("invalid_span", trace_id, f"span {span_id}: {exc}"[:500]))
    return taken, rejected


def _spans(request: ExportTraceServiceRequest) -> Iterator[tuple[dict[str, Any], Any]]:
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for otel_span in scope_spans.spans:
                yield resource, otel_span


def _span(otel_span: Any, span_id: str, span_attrs: dict[str, Any]) -> Span:
    events = [(e.name, attributes(e.attributes)) for e in otel_span.events[:MAX_EVENTS]]
    content = span_content(span_attrs, events)
    kept = {k: v for k, v in span_attrs.items() if not k.startswith(CONTENT_ATTRIBUTES)}
    kept = dict(list(kept.items())[:MAX_ATTRIBUTES])
    if otel_span.status.code == 2:  # STATUS_CODE_ERROR
        kept["otel.status_code"] = "ERROR"
        if otel_span.status.message:
            kept["otel.status_description"] = otel_span.status.message[:1000]
    return Span(span_id=span_id, parent_span_id=_hex_id(otel_span.parent_span_id, 8),
                name=otel_span.name[:256], kind=span_kind(otel_span.name, span_attrs),
                input=content.input, output=content.output, attributes=kept,
                start_time=_time(otel_span.start_time_unix_nano), end_time=_time(otel_span.end_time_unix_nano))


# --- 3. assembly ----------------------------------------------------------------------------------

def assemble(spans: list[BufferedSpan], *, partial: bool, assembly: str, dropped_spans: int = 0) -> Trace:
    """One trace of buffered spans (all of one project and trace id). A trace whose root never
    arrived gets an empty placeholder root, so it reads like an OTel-style trace with an empty
    root: the agent side falls back to child span outputs, never to a tool's."""
    if not spans:
        raise ValueError("a trace needs at least one span")
    ordered = sorted(spans, key=lambda b: (b.span.start_time or datetime.max.replace(tzinfo=UTC), b.span.span_id))
    roots = [b for b in ordered if b.is_root]
    present = {b.span.span_id for b in ordered}
    trace_spans = [b.span for b in roots] + [b.span for b in ordered if not b.is_root]
    if not roots:
        orphan = next((b.span for b in ordered if b.span.parent_span_id not in present), ordered[0].span)
        trace_spans.insert(0, Span(span_id=orphan.parent_span_id or "root", name=PLACEHOLDER_ROOT,
                                   start_time=orphan.start_time, attributes={"sgw.placeholder": True}))
    lead = roots[0] if roots else ordered[0]
    agent = lead.agent or next((b.agent for b in ordered if b.agent), None)
    service = lead.service or next((b.service for b in ordered if b.service), None)
    session = lead.session or next((b.session for b in ordered if b.session), None)
    started = trace_spans[0].start_time or next((s.start_time for s in trace_spans if s.start_time), None)
    return Trace(
        trace_id=lead.trace_id, project_id=lead.project_id, agent_id=agent or service or "unknown_service",
        session_id=session, timestamp=started or datetime.now(UTC), spans=trace_spans,
        metadata={"source": "otlp", "partial": partial or not roots or dropped_spans > 0, "assembly": assembly,
                  "spanCount": len(spans), "droppedSpans": dropped_spans, "serviceName": service},
    )
