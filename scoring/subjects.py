"""What a member reads: the trace wire model, and the subject made of one trace or a session.

Trace scope: input and output are the root span's. Session scope (the spec's "Scoring whole
sessions"): judges read one formatted transcript; pattern and code/external members read the
conversation split by speaker - every user turn joined as input, every agent turn joined as
output. Both sides come from root spans first. For OTel-style traces whose roots are empty, the
user side falls back to the whole formatted transcript (over-matching is the honest direction
for a tripwire) and the agent side only to child span outputs - genuinely the agent's words -
staying empty when those are missing too. Tool spans are never passed as text, and a code
scorer's ``spans`` are the last (anchor) trace's only.
"""

from __future__ import annotations

from collections.abc import Container
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

from scoring.frozen import frozen

SubjectScope = Literal["trace", "session", "span"]

TURN_SEPARATOR = "\n\n"


def _utc_if_naive(value: datetime) -> datetime:
    # A time without a zone is read as UTC (as OTLP's are): times from different SDKs must
    # compare - a session's turns are ordered by them - and ``.timestamp()`` must not depend on
    # the host's zone.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


TraceTime = Annotated[datetime, AfterValidator(_utc_if_naive)]


class _TraceModel(BaseModel):
    # Traces come from many SDKs: unknown fields are ignored, not refused.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore",
                              frozen=True)


class Span(_TraceModel):
    # Ids name claims, ratings and Kafka keys: bounded like a trace's (OTel's are 16 hex digits).
    span_id: str = Field(min_length=1, max_length=256)
    parent_span_id: str | None = Field(None, max_length=256)
    name: str = ""
    kind: str | None = None
    input: Any = None
    output: Any = None
    attributes: dict[str, Any] = Field(default_factory=dict)
    start_time: TraceTime | None = None
    end_time: TraceTime | None = None


class Trace(_TraceModel):
    """One ingested trace (the value on the traces topic)."""

    trace_id: str = Field(min_length=1, max_length=256)
    project_id: str = Field(min_length=1, max_length=128)
    agent_id: str = Field(min_length=1, max_length=128)
    session_id: str | None = Field(None, max_length=256)
    timestamp: TraceTime
    spans: list[Span] = Field(min_length=1)
    expected: Any = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def root(self) -> Span:
        """The span without a parent (the first one, should an SDK send several)."""
        return next((s for s in self.spans if not s.parent_span_id), self.spans[0])

    def children(self) -> list[Span]:
        root = self.root
        return [s for s in self.spans if s is not root]


def as_text(value: Any) -> str:
    """A span's input or output as text: strings as they are, structures as compact JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def _agent_words(trace: Trace) -> str:
    """The agent side of one trace: the root's output, else its non-tool child span outputs."""
    root_output = as_text(trace.root.output).strip()
    if root_output:
        return root_output
    outputs = [as_text(s.output).strip() for s in trace.children() if s.kind != "tool"]
    return "\n".join(o for o in outputs if o)


def _user_words(trace: Trace) -> str:
    return as_text(trace.root.input).strip()


def format_transcript(traces: list[Trace]) -> str:
    """The whole conversation as a person reads it, turn by turn, tool calls left out."""
    lines: list[str] = []
    for number, trace in enumerate(traces, start=1):
        lines.append(f"--- Turn {number} ---")
        user, agent = _user_words(trace), _agent_words(trace)
        if user:
            lines.append(f"User: {user}")
        else:
            # An OTel-style root carries nothing: show what the non-tool spans were asked.
            asked = [as_text(s.input).strip() for s in trace.children() if s.kind != "tool"]
            lines.extend(f"User/context: {a}" for a in asked if a)
        if agent:
            lines.append(f"Agent: {agent}")
    return "\n".join(lines)


@frozen
class Subject:
    """What one group is asked to grade: a trace, or a whole session."""

    scope: SubjectScope
    input: str
    output: str
    expected: Any
    # A trace's own span models, made JSON-shaped only when a member reads them (code and
    # external scorers, through ``member_payload``); or the JSON-shaped spans a dataset row or a
    # playground example gave.
    spans: tuple[Span, ...] | list[dict[str, Any]]
    metadata: dict[str, Any]
    transcript: str  # what a judge reads at session scope ("" at trace scope)
    turns: int = 1
    project_id: str = ""
    agent_id: str = ""
    trace_id: str | None = None
    session_id: str | None = None
    # Span scope: the step graded, and what a judge reads as context (the trace's request).
    span_id: str | None = None
    span_name: str | None = None
    span_kind: str | None = None
    context: str = ""
    at: float | None = None  # the trace's own time (the last turn's, for a session), Unix seconds

    def member_payload(self, reads: Container[str] | None = None) -> dict[str, Any]:
        """The arguments of a code scorer's score() and the body sent to an external scorer;
        ``reads``: only the arguments named, the code scorer's (``scoring.members.code_arguments``)
        - the spans, most of a payload, are then built only for a scorer that reads them."""
        payload: dict[str, Any] = {}
        if reads is None or "input" in reads:
            payload["input"] = self.input
        if reads is None or "output" in reads:
            payload["output"] = self.output
        if reads is None or "expected" in reads:
            payload["expected"] = self.expected
        if reads is None or "spans" in reads:
            spans = self.spans
            payload["spans"] = span_dicts(spans) if isinstance(spans, tuple) else spans
        if reads is None or "metadata" in reads:
            payload["metadata"] = self.metadata
        return payload


_SPANS = TypeAdapter(tuple[Span, ...])  # the reference ``span_dicts`` is tested against


def span_dicts(spans: tuple[Span, ...]) -> list[dict[str, Any]]:
    """Spans as a code or external scorer reads them: what ``_SPANS.dump_python(spans,
    mode="json", by_alias=True, exclude_none=True)`` gives, built directly (the serializer
    inspects every value of the free-form fields, a share of a trace's CPU). Those fields came
    from JSON (a record's, or OTLP's mapped to it), so they are JSON already. A field added to
    ``Span`` must be written here too: a test compares the two on every field."""
    dicts: list[dict[str, Any]] = []
    for span in spans:
        d: dict[str, Any] = {"spanId": span.span_id}
        if span.parent_span_id is not None:
            d["parentSpanId"] = span.parent_span_id
        d["name"] = span.name
        if span.kind is not None:
            d["kind"] = span.kind
        if span.input is not None:
            d["input"] = span.input
        if span.output is not None:
            d["output"] = span.output
        d["attributes"] = span.attributes
        if span.start_time is not None:
            d["startTime"] = _json_time(span.start_time)
        if span.end_time is not None:
            d["endTime"] = _json_time(span.end_time)
        dicts.append(d)
    return dicts


def _json_time(value: datetime) -> str:
    """A time as pydantic writes it in JSON: ISO 8601, "Z" for a zero offset."""
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def trace_subject(trace: Trace) -> Subject:
    user = _user_words(trace)
    return Subject(
        scope="trace",
        input=user or format_transcript([trace]),
        output=_agent_words(trace),
        expected=trace.expected,
        spans=tuple(trace.spans),
        metadata=trace.metadata,
        transcript="",
        project_id=trace.project_id,
        agent_id=trace.agent_id,
        trace_id=trace.trace_id,
        session_id=trace.session_id,
        at=trace.timestamp.timestamp(),
    )


MAX_SUBTREE_SPANS = 500  # a step's spans a code scorer reads: the span and its first descendants
MAX_SPAN_NAME_CHARS = 256  # of a step's name in ratings, Signals and deliveries


def children_of(trace: Trace) -> dict[str, list[Span]]:
    """Each span id's child spans, in the trace's order: built once per trace."""
    below: dict[str, list[Span]] = {}
    for s in trace.spans:
        if s.parent_span_id:
            below.setdefault(s.parent_span_id, []).append(s)
    return below


def span_subject(trace: Trace, span: Span, below: dict[str, list[Span]] | None = None) -> Subject:
    """One step of a trace as a subject (span scope): the span's own input and output (as text, as
    the OpenTelemetry mapping leaves them), the span and its first ``MAX_SUBTREE_SPANS``
    descendants as a code scorer's ``spans``, the trace's metadata, and the trace's request (the
    root's input) as a judge's context. ``below``: ``children_of(trace)``, shared by its spans."""
    below = children_of(trace) if below is None else below
    subtree: list[Span] = []
    stack, seen = [span], set()
    while stack and len(subtree) < MAX_SUBTREE_SPANS:  # iterative, each span once: parents may cycle
        current = stack.pop()
        if current.span_id in seen:
            continue
        seen.add(current.span_id)
        subtree.append(current)
        stack.extend(reversed(below.get(current.span_id, [])))
    name = span.name if len(span.name) <= MAX_SPAN_NAME_CHARS else span.name[:MAX_SPAN_NAME_CHARS - 1] + "…"
    return Subject(
        scope="span",
        input=as_text(span.input),
        output=as_text(span.output),
        expected=None,
        spans=tuple(subtree),
        metadata=trace.metadata,
        transcript="",
        project_id=trace.project_id,
        agent_id=trace.agent_id,
        trace_id=trace.trace_id,
        session_id=trace.session_id,
        span_id=span.span_id,
        span_name=name,
        span_kind=span.kind,
        context=_user_words(trace) if span is not trace.root else "",
        at=trace.timestamp.timestamp(),
    )


def session_subject(traces: list[Trace]) -> Subject:
    """A conversation as one subject. ``traces`` are its turns; they are ordered by time here."""
    if not traces:
        raise ValueError("a session needs at least one trace")
    turns = sorted(traces, key=lambda t: (t.timestamp, t.trace_id))
    anchor = turns[-1]
    transcript = format_transcript(turns)
    user_side = TURN_SEPARATOR.join(u for u in (_user_words(t) for t in turns) if u)
    agent_side = TURN_SEPARATOR.join(a for a in (_agent_words(t) for t in turns) if a)
    return Subject(
        scope="session",
        input=user_side or transcript,
        output=agent_side,
        expected=None,
        spans=tuple(anchor.spans),
        metadata={**anchor.metadata, "sessionId": anchor.session_id, "turns": len(turns)},
        transcript=transcript,
        turns=len(turns),
        project_id=anchor.project_id,
        agent_id=anchor.agent_id,
        trace_id=anchor.trace_id,
        session_id=anchor.session_id,
        at=anchor.timestamp.timestamp(),
    )
