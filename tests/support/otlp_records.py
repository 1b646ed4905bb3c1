"""OTLP records exactly as the Collector's Kafka exporter writes them, made from real
OpenTelemetry SDK spans: ``otlp_proto`` is the SDK's own protobuf encoder's
``ExportTraceServiceRequest``; ``otlp_json`` is the OTLP/JSON mapping of the same request (ids in
hex, enums as numbers). With ``partition_traces_by_id`` the exporter writes one request per trace,
keyed by the trace id in hex; without it one request holds every span, unkeyed."""

from __future__ import annotations

import base64
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

Record = tuple[bytes | None, bytes]


class Telemetry:
    """An SDK tracer provider per service (resource); finished spans are collected in memory."""

    def __init__(self, **resource: Any) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider(resource=Resource.create(resource))
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer: Tracer = self.provider.get_tracer("tests.otlp")

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def clear(self) -> None:
        self.exporter.clear()


@contextmanager
def span(tracer: Tracer, name: str, **attributes: Any) -> Iterator[Any]:
    with tracer.start_as_current_span(name, attributes=attributes) as s:
        yield s


def trace_hex(s: ReadableSpan) -> str:
    assert s.context is not None
    return f"{s.context.trace_id:032x}"


def proto(spans: Sequence[ReadableSpan]) -> bytes:
    return encode_spans(list(spans)).SerializeToString()


def as_json(spans: Sequence[ReadableSpan]) -> bytes:
    document = json_format.MessageToDict(encode_spans(list(spans)), use_integers_for_enums=True)
    for resource_spans in document.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for s in scope_spans.get("spans", []):
                for name in ("traceId", "spanId", "parentSpanId"):
                    if name in s:
                        s[name] = base64.b64decode(s[name]).hex()
    return orjson.dumps(document)


def records(spans: Sequence[ReadableSpan], *, encoding: str = "otlp_proto", by_trace: bool = True) -> list[Record]:
    """What the exporter writes for ``spans``: one record per trace keyed by its id
    (``partition_traces_by_id``), or one unkeyed record holding them all."""
    encode = proto if encoding == "otlp_proto" else as_json
    if not by_trace:
        return [(None, encode(spans))]
    by_id: dict[str, list[ReadableSpan]] = {}
    for s in spans:
        by_id.setdefault(trace_hex(s), []).append(s)
    return [(trace_id.encode(), encode(group)) for trace_id, group in by_id.items()]
