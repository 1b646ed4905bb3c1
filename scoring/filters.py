"""The online profile's filter, compiled: does a trace belong to a live group's traffic?

Compiled once per catalog snapshot, evaluated on a view of the trace (``TraceView`` or ``HeaderView``) in
three-valued logic. The one rule: a leaf on an unknown field is unknown (None), so a record is decided from
its headers alone only when every group says false. The views and the logic: docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from scorer_groups.filters import AllOf, AnyOf, FieldCondition, FilterNode, NotOf, walk
from scoring.models import compile_user_regex
from scoring.regex_work import RegexWork
from scoring.subjects import Span, Trace, as_text


class _Marker:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


MISSING: Final[Any] = _Marker("MISSING")  # the trace has no such field (or it is null)
UNKNOWN: Final[Any] = _Marker("UNKNOWN")  # the view cannot tell (a header view, past its headers)

# What producers the operator runs (the OTLP intake, the demo) write on each trace record, so
# that most records are routed before their value is parsed. A record carries all of them
# (``sgw-session`` only when the trace has a session) or none: headers are a hint the worker
# trusts only to skip work a tenant could skip anyway by not sending the trace.
HEADER_PROJECT = "sgw-project"
HEADER_AGENT = "sgw-agent"
HEADER_TRACE = "sgw-trace"
HEADER_SESSION = "sgw-session"
HEADER_ROOT_NAME = "sgw-root-name"
ROUTING_HEADERS = (HEADER_PROJECT, HEADER_AGENT, HEADER_TRACE, HEADER_SESSION, HEADER_ROOT_NAME)
# A routing header longer than this is not read: the record is parsed and decided on its trace
# (whose ids the trace schema bounds). A header is the producer's word, and a filter's regex runs
# on it before anything is parsed.
MAX_ROUTING_HEADER_BYTES = 1024


def routing_headers(trace: Trace) -> list[tuple[str, bytes]]:
    """The headers a producer writes with ``trace``'s record."""
    headers = [(HEADER_PROJECT, trace.project_id.encode()), (HEADER_AGENT, trace.agent_id.encode()),
               (HEADER_TRACE, trace.trace_id.encode()), (HEADER_ROOT_NAME, trace.root.name.encode())]
    if trace.session_id:
        headers.append((HEADER_SESSION, trace.session_id.encode()))
    return headers


class Path:
    """A dotted path, compiled once: at each level the keys to try, longest first
    (``gen_ai.request.model`` is one attribute key), each with the path that follows it into a
    nested object. Save time bounds a path's parts (``MAX_PATH_PARTS``), so this stays small."""

    __slots__ = ("steps",)

    def __init__(self, steps: list[tuple[str, Path | None]]) -> None:
        self.steps = steps

    @classmethod
    def of(cls, parts: Sequence[str], made: dict[tuple[str, ...], Path] | None = None) -> Path:
        made = {} if made is None else made
        key = tuple(parts)
        if key not in made:
            made[key] = cls([(".".join(parts[:end]), cls.of(parts[end:], made) if end < len(parts) else None)
                             for end in range(len(parts), 0, -1)])
        return made[key]


def lookup(mapping: Mapping[str, Any], path: Path) -> Any:
    """The value at a dotted path, or ``MISSING`` (a null is missing: a shorter key may still
    lead to a value)."""
    for key, rest in path.steps:
        value = mapping.get(key)
        if value is None:
            continue
        if rest is None:
            return value
        if isinstance(value, dict):
            found = lookup(value, rest)
            if found is not MISSING:
                return found
    return MISSING


# How many span values one trace's filters may compare, over all its groups: past it, a
# condition on spans is false (fail closed: the trace is not scored by that group). A trace of
# 5,000 spans under a few span conditions is far below; a hostile trace of 60,000 spans under
# 32 conditions in each of many groups would otherwise hold the event loop for minutes.
MAX_SPAN_TESTS = 250_000


class TraceView:
    """A decoded trace's fields, each read (and the texts made) at most once per trace, whatever
    the number of groups and conditions that read it."""

    __slots__ = ("_root", "_spans", "_texts", "span_tests_left", "trace", "work")

    def __init__(self, trace: Trace, work: RegexWork | None = None) -> None:
        self.trace = trace
        self._root: Span | None = None
        self._texts: dict[str, Any] = {}
        self._spans: dict[str, list[Any]] = {}
        self.span_tests_left = MAX_SPAN_TESTS
        # The trace's matching time, shared with its span views (a conversation's turns share one).
        self.work = RegexWork() if work is None else work

    @property
    def root(self) -> Span:
        if self._root is None:
            self._root = self.trace.root
        return self._root

    def field(self, name: str) -> Any:
        """A single-valued field (not metadata, not spans)."""
        if name == "agentId":
            return self.trace.agent_id
        if name == "traceId":
            return self.trace.trace_id
        if name == "sessionId":
            return self.trace.session_id or MISSING
        if name == "root.name":
            return self.root.name
        if name == "durationMs":
            start, end = self.root.start_time, self.root.end_time
            return MISSING if start is None or end is None else (end - start).total_seconds() * 1000.0
        # root.input, root.output: as text, as the members read them
        text = self._texts.get(name)
        if text is None:
            raw = self.root.input if name == "root.input" else self.root.output
            text = self._texts[name] = MISSING if raw is None else as_text(raw)
        return text

    def metadata(self, path: Path) -> Any:
        return lookup(self.trace.metadata, path)

    def attributes(self, path: Path) -> Any:
        return UNKNOWN  # a trace filter has no span of its own (refused at save time)

    def spans(self, field: str, path: Path | None = None) -> list[Any] | None:
        """The field (``name``, ``kind``, or an attribute's ``path``) of every span, read once
        per trace; None once the trace's span tests are spent (the condition is then false)."""
        values = self._spans.get(field)
        if values is None:
            if field == "spans.name":
                values = [s.name for s in self.trace.spans]
            elif field == "spans.kind":
                values = [MISSING if s.kind is None else s.kind for s in self.trace.spans]
            else:
                assert path is not None
                values = [lookup(s.attributes, path) if s.attributes else MISSING for s in self.trace.spans]
            self._spans[field] = values
        self.span_tests_left -= len(values)
        return values if self.span_tests_left >= 0 else None


class SpanView:
    """One span's fields, for a span-scope group's ``spanFilter``; its regexes spend its trace's
    matching time (``work``)."""

    __slots__ = ("_texts", "span", "work")

    def __init__(self, span: Span, work: RegexWork) -> None:
        self.span = span
        self._texts: dict[str, Any] = {}
        self.work = work

    def field(self, name: str) -> Any:
        span = self.span
        if name == "name":
            return span.name
        if name == "kind":
            return MISSING if span.kind is None else span.kind
        if name == "durationMs":
            start, end = span.start_time, span.end_time
            return MISSING if start is None or end is None else (end - start).total_seconds() * 1000.0
        if name not in self._texts:  # input, output: as text, as the members read them
            raw = span.input if name == "input" else span.output
            self._texts[name] = MISSING if raw is None else as_text(raw)
        return self._texts[name]

    def attributes(self, path: Path) -> Any:
        return lookup(self.span.attributes, path) if self.span.attributes else MISSING

    def metadata(self, path: Path) -> Any:
        return UNKNOWN  # a span filter names the span's own fields only (refused at save time)

    def spans(self, field: str, path: Path | None = None) -> Any:
        return UNKNOWN


class HeaderView:
    """The fields a record's routing headers carry; every other is ``UNKNOWN``. Only for a record
    that carries the project, agent, trace and root-name headers (``complete``): then an absent
    (or empty) session header means the trace has no session."""

    __slots__ = ("_values",)

    REQUIRED = (HEADER_PROJECT, HEADER_AGENT, HEADER_TRACE, HEADER_ROOT_NAME)

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._values = {"agentId": headers.get(HEADER_AGENT, UNKNOWN), "traceId": headers.get(HEADER_TRACE, UNKNOWN),
                        "sessionId": headers.get(HEADER_SESSION) or MISSING,
                        "root.name": headers.get(HEADER_ROOT_NAME, UNKNOWN)}

    @property
    def work(self) -> RegexWork:
        """No matching at all: a regex or a substring on a header cannot tell, and the record is
        parsed and decided in the routing step, which gives the event loop back in slices."""
        return _HEADERS_DO_NOT_MATCH

    @classmethod
    def complete(cls, headers: Mapping[str, str]) -> bool:
        return all(name in headers for name in cls.REQUIRED)

    def field(self, name: str) -> Any:
        return self._values.get(name, UNKNOWN)

    def metadata(self, path: Path) -> Any:
        return UNKNOWN

    def spans(self, field: str, path: Path | None = None) -> Any:
        return UNKNOWN

    def attributes(self, path: Path) -> Any:
        return UNKNOWN


_HEADERS_DO_NOT_MATCH = RegexWork(seconds=0.0)  # every search refused (its counts are read by no one)

View = TraceView | HeaderView | SpanView
Decide = Callable[[View], "bool | None"]  # True, False, or None: the view cannot tell
# One field value (or ``MISSING``) against a condition; None: it cannot tell (a regex past the
# trace's matching time).
Test = Callable[[Any, RegexWork], "bool | None"]


# --- Compiling ----------------------------------------------------------------------------------


def _key(value: Any) -> tuple[str, Any] | None:
    """What equality compares: a boolean is never a number, a number never a string."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, str):
        return ("s", value)
    return None  # an object or a list equals no value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _test(op: str, value: Any) -> Test:
    """The comparison of one field value (or ``MISSING``) with the condition's value."""
    if op in ("eq", "neq"):
        wanted = _key(value)
        if op == "eq":
            return lambda x, _: x is not MISSING and _key(x) == wanted
        return lambda x, _: x is MISSING or _key(x) != wanted
    if op in ("in", "nin"):
        keys = frozenset(_key(v) for v in value)
        if op == "in":
            return lambda x, _: x is not MISSING and _key(x) in keys
        return lambda x, _: x is MISSING or _key(x) not in keys
    if op == "contains":
        wanted = _key(value)
        if isinstance(value, str):  # a substring of a text: bounded and timed as a regex is
            return lambda x, work: (work.contains(value, x) if isinstance(x, str)
                                    else isinstance(x, list) and any(_key(e) == wanted for e in x))
        return lambda x, _: isinstance(x, list) and any(_key(e) == wanted for e in x)
    if op == "startsWith":
        return lambda x, _: isinstance(x, str) and x.startswith(value)
    if op == "matches":
        regex = compile_user_regex(value)
        # Bounded per search and per trace (scoring.regex_work): a tenant's worst regex costs
        # that tenant's trace, never the loop.
        return lambda x, work: isinstance(x, str) and work.search(regex, x)
    if op == "exists":
        return lambda x, _: (x is not MISSING) == value
    if op == "gt":
        return lambda x, _: _is_number(x) and x > value
    if op == "gte":
        return lambda x, _: _is_number(x) and x >= value
    if op == "lt":
        return lambda x, _: _is_number(x) and x < value
    return lambda x, _: _is_number(x) and x <= value  # lte


def _leaf(condition: FieldCondition) -> Decide:
    test = _test(condition.op, condition.value)
    field = condition.field
    if field.startswith("metadata."):
        path = Path.of(field.removeprefix("metadata.").split("."))

        def on_metadata(view: View) -> bool | None:
            value = view.metadata(path)
            return None if value is UNKNOWN else test(value, view.work)
        return on_metadata
    if field.startswith("attributes."):  # a span filter's
        attribute_path = Path.of(field.removeprefix("attributes.").split("."))

        def on_attributes(view: View) -> bool | None:
            value = view.attributes(attribute_path)
            return None if value is UNKNOWN else test(value, view.work)
        return on_attributes
    if field.startswith("spans."):
        attribute = field.removeprefix("spans.attributes.")
        path_or_none = Path.of(attribute.split(".")) if attribute != field else None

        def on_spans(view: View) -> bool | None:  # some span satisfies it
            values = view.spans(field, path_or_none)
            if values is UNKNOWN:
                return None
            if values is None:
                return False
            unknown = False
            for value in values:
                result = test(value, view.work)
                if result:
                    return True
                unknown = unknown or result is None
            return None if unknown else False
        return on_spans

    def on_field(view: View) -> bool | None:
        value = view.field(field)
        return None if value is UNKNOWN else test(value, view.work)
    return on_field


def _join(parts: list[Decide], settled_by: bool) -> Decide:
    """``all`` (settled by a false part) or ``any`` (by a true one): the first settling part
    decides; else an unknown part leaves it unknown; else it is the other value."""
    def decide(view: View) -> bool | None:
        unknown = False
        for part in parts:
            result = part(view)
            if result is settled_by:
                return settled_by
            unknown = unknown or result is None
        return None if unknown else not settled_by
    return decide


def _not(part: Decide) -> Decide:
    def decide(view: View) -> bool | None:
        result = part(view)
        return None if result is None else not result
    return decide


def compile_filter(node: FilterNode) -> Decide:
    """The filter as a function of a view (recursion is bounded by the save-time depth rule).
    A filter that does not compile (a regex stored before a stricter rule) matches nothing:
    failing closed spends nothing on traffic the group may not have wanted."""
    try:
        return _compiled(node)
    except ValueError:
        return lambda view: False


def _compiled(node: FilterNode) -> Decide:
    if isinstance(node, FieldCondition):
        return _leaf(node)
    if isinstance(node, NotOf):
        return _not(_compiled(node.not_))
    if isinstance(node, AllOf):
        return _join([_compiled(child) for child in node.all], settled_by=False)
    if isinstance(node, AnyOf):
        return _join([_compiled(child) for child in node.any], settled_by=True)
    raise TypeError(f"not a filter node: {type(node).__name__}")


def regex_errors(node: FilterNode | None, path: str = "online.filter") -> list[str]:
    """The ``matches`` regexes RE2 refuses, each with its path: the check only the server makes."""
    errors = []
    for loc, leaf in walk(node) if node is not None else []:
        if leaf.op == "matches":
            try:
                compile_user_regex(str(leaf.value))
            except ValueError as exc:
                where = path + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
                errors.append(f"{where}.value: {exc}")
    return errors
