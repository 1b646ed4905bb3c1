"""``online.filter``: which traces a live group sees at all, before its sample decides.

A filter is a tree of conditions. A leaf compares one field of the trace as it is on the wire::

    {"field": "metadata.environment", "op": "eq", "value": "production"}

and ``{"all": [...]}``, ``{"any": [...]}`` and ``{"not": {...}}`` combine them, nested at most
``MAX_FILTER_DEPTH`` levels, with at most ``MAX_FILTER_CONDITIONS`` leaves. This module is the
wire format and every save-time rule (an error names its path: ``online.filter.all[1].op``);
the worker's evaluator is ``scoring.filters``. A regex (``matches``) must also compile in RE2,
the engine the worker matches with: the server checks that, as it does for patterns.

Fields:

- ``agentId``, ``sessionId``, ``traceId``; ``root.name``, ``root.input``, ``root.output`` (the
  root span's, input and output read as text, as the members read them); ``durationMs`` of the
  root span (from its start and end times);
- ``metadata.<path>``: dots walk into nested objects (a key that itself holds dots is found too);
- ``spans.name``, ``spans.kind``, ``spans.attributes.<key>``: true when *some* span satisfies
  the condition (``spans.attributes.gen_ai.request.model``: attribute keys hold dots). "No span
  is a tool" is ``{"not": {"field": "spans.kind", "op": "eq", "value": "tool"}}``.

A field the trace does not have matches nothing but ``exists: false``, ``neq`` and ``nin``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import (
    Discriminator,
    Field,
    JsonValue,
    Tag,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from scorer_groups.wire import WireModel

MAX_FILTER_DEPTH = 4  # all/any/not levels above a leaf
MAX_FILTER_CONDITIONS = 32  # leaves in one filter
MAX_FILTER_VALUES = 200  # of an in/nin list
MAX_FILTER_TEXT = 1_000  # characters of a string value (a regex: MAX_FILTER_REGEX)
MAX_FILTER_REGEX = 5_000
MAX_FIELD_CHARS = 300
MAX_PATH_PARTS = 8  # dots in a metadata path or attribute key, plus one

FilterOp = Literal["eq", "neq", "in", "nin", "contains", "startsWith", "matches", "exists",
                   "gt", "gte", "lt", "lte"]
OPS: tuple[str, ...] = FilterOp.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True)
class FieldSet:
    """What a filter may name: fields named exactly, roots a dotted path follows, numeric fields."""

    noun: str  # "a trace", "a span": in the messages
    exact: tuple[str, ...]
    prefixes: tuple[str, ...]
    numeric: tuple[str, ...] = ("durationMs",)


# ``online.filter``: the trace as it is on the wire.
TRACE_FIELDS = FieldSet("a trace", ("agentId", "sessionId", "traceId", "root.name", "root.input", "root.output",
                                    "durationMs", "spans.name", "spans.kind"), ("metadata.", "spans.attributes."))
# ``online.spanFilter`` (span scope): one span.
SPAN_FIELDS = FieldSet("a span", ("name", "kind", "input", "output", "durationMs"), ("attributes.",))
_TEXT_OPS = ("contains", "startsWith", "matches")
_ORDER_OPS = ("gt", "gte", "lt", "lte")


# --- The wire models ------------------------------------------------------------------------


class FieldCondition(WireModel):
    """One comparison: ``field`` ``op`` ``value``."""

    field: str
    op: FilterOp
    value: JsonValue = None


class AllOf(WireModel):
    """True when every condition is."""

    all: list[FilterNode]


class AnyOf(WireModel):
    """True when one condition is."""

    any: list[FilterNode]


class NotOf(WireModel):
    """True when the condition is not."""

    not_: FilterNode = Field(alias="not")


def _node_kind(value: Any) -> str | None:
    if isinstance(value, dict):
        return next((key for key in ("field", "all", "any", "not") if key in value), None)
    kinds: dict[type, str] = {FieldCondition: "field", AllOf: "all", AnyOf: "any", NotOf: "not"}
    return kinds.get(type(value))


FilterNode = Annotated[
    Union[Annotated[FieldCondition, Tag("field")], Annotated[AllOf, Tag("all")],  # noqa: UP007 - tags
          Annotated[AnyOf, Tag("any")], Annotated[NotOf, Tag("not")]],
    Discriminator(_node_kind),
]
AllOf.model_rebuild()
AnyOf.model_rebuild()
NotOf.model_rebuild()


# --- Save-time rules, with the path of each fault ------------------------------------------------

Loc = tuple[int | str, ...]


def _fault(loc: Loc, value: object, message: str) -> InitErrorDetails:
    return InitErrorDetails(type=PydanticCustomError("filter", message), loc=loc, input=value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_scalar(value: object) -> bool:
    return isinstance(value, str | bool) or _is_number(value)


def field_fault(field: object, fields: FieldSet = TRACE_FIELDS) -> str | None:
    """Why ``field`` names nothing a trace has, or None."""
    if not isinstance(field, str):
        return "must be a string naming a field of the trace"
    if len(field) > MAX_FIELD_CHARS:
        return f"must be at most {MAX_FIELD_CHARS} characters"
    if field in fields.exact:
        return None
    prefix = next((p for p in fields.prefixes if field.startswith(p)), None)
    if prefix is None:
        return (f"{field!r} is not a field of {fields.noun}; use one of {', '.join(fields.exact)}, "
                f"{' or '.join(p + '<path>' for p in fields.prefixes)}")
    rest = field[len(prefix):]
    if not rest or (prefix == "metadata." and "" in rest.split(".")):
        return f"{prefix}<...> needs a {'path without empty parts' if rest else 'key after the dot'}"
    if rest.count(".") >= MAX_PATH_PARTS:
        return f"{prefix}<...> has at most {MAX_PATH_PARTS} dot-separated parts"
    return None


def _value_fault(field: str, op: str, value: object, fields: FieldSet) -> str | None:
    """Why ``value`` does not fit ``op`` on ``field``, or None."""
    if op == "exists":
        return None if isinstance(value, bool) else "exists takes true or false"
    if op in ("in", "nin"):
        if not isinstance(value, list) or not value:
            return f"{op} takes a non-empty list of strings, numbers or booleans"
        if len(value) > MAX_FILTER_VALUES:
            return f"{op} takes at most {MAX_FILTER_VALUES} values"
        if not all(_is_scalar(v) for v in value):
            return f"{op} takes strings, numbers or booleans (no null, lists or objects)"
        items: list[object] = value
    else:
        items = [value]
    if op in _ORDER_OPS and not all(_is_number(v) for v in items):
        return f"{op} compares numbers"
    if op in ("startsWith", "matches") and not (isinstance(value, str) and value):
        return f"{op} takes a non-empty string"
    if not all(_is_scalar(v) for v in items):
        return f"{op} takes a string, a number or a boolean (for a missing field use exists)"
    limit = MAX_FILTER_REGEX if op == "matches" else MAX_FILTER_TEXT
    if any(isinstance(v, str) and len(v) > limit for v in items):
        return f"a string value is at most {limit} characters"
    if field in fields.numeric:
        if op in _TEXT_OPS:
            return f"{field} is a number: compare it with eq, neq, in, nin, gt, gte, lt or lte"
        if not all(_is_number(v) for v in items):
            return f"{field} is a number: compare it with numbers"
    return None


_ONE_OF = "a condition is either {field, op, value} or exactly one of all, any, not"


def filter_errors(raw: object, fields: FieldSet = TRACE_FIELDS) -> list[InitErrorDetails]:
    """Every fault of a filter (JSON as sent), each with its path from the filter's root."""
    faults: list[InitErrorDetails] = []
    leaves = 0
    # (node, its path, the all/any/not levels above it); an explicit stack: a hostile filter
    # nested a thousand levels is refused, not a stack overflow.
    stack: list[tuple[object, Loc, int]] = [(raw, (), 0)]
    while stack:
        node, loc, depth = stack.pop()
        if not isinstance(node, dict):
            faults.append(_fault(loc, node, _ONE_OF))
            continue
        kinds = [k for k in ("field", "all", "any", "not") if k in node]
        if not kinds:
            faults.append(_fault(loc, node, _ONE_OF))
            continue
        if kinds[0] == "field" or "op" in node or "value" in node:
            leaves += 1
            for key in sorted(set(node) - {"field", "op", "value"}):
                faults.append(_fault((*loc, key), node[key], f"{key!r} is not a key of a condition ({_ONE_OF})"))
            field, op = node.get("field"), node.get("op")
            fault = field_fault(field, fields) if "field" in node else "a condition names a field"
            if fault:
                faults.append(_fault((*loc, "field"), field, fault))
            if op not in OPS:
                faults.append(_fault((*loc, "op"), op, f"must be one of {', '.join(OPS)}"))
            elif "value" not in node:
                faults.append(_fault((*loc, "value"), None, f"{op} needs a value"))
            elif not fault and (why := _value_fault(str(field), str(op), node["value"], fields)):
                faults.append(_fault((*loc, "value"), node["value"], why))
            continue
        if len(node) != 1:
            faults.append(_fault(loc, node, _ONE_OF))
            continue
        kind = kinds[0]
        if depth >= MAX_FILTER_DEPTH:
            faults.append(_fault((*loc, kind), node[kind], f"filters nest at most {MAX_FILTER_DEPTH} levels of "
                                                           "all, any and not"))
            continue
        if kind == "not":
            stack.append((node["not"], (*loc, "not"), depth + 1))
            continue
        children = node[kind]
        if not isinstance(children, list) or not children:
            faults.append(_fault((*loc, kind), children, f"{kind} takes a non-empty list of conditions"))
            continue
        if len(children) > MAX_FILTER_CONDITIONS:
            faults.append(_fault((*loc, kind), children, f"at most {MAX_FILTER_CONDITIONS} conditions"))
            continue
        stack.extend((child, (*loc, kind, i), depth + 1) for i, child in reversed(list(enumerate(children))))
    if leaves > MAX_FILTER_CONDITIONS:
        faults.append(_fault((), raw, f"a filter has at most {MAX_FILTER_CONDITIONS} conditions, this one "
                                      f"has {leaves}"))
    return sorted(faults, key=lambda f: [str(p) for p in f["loc"]])


def _checked(fields: FieldSet) -> Callable[[Any, ValidatorFunctionWrapHandler], Any]:
    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        raw = value.model_dump(by_alias=True) if isinstance(value, WireModel) else value
        faults = filter_errors(raw, fields)
        if faults:
            raise ValidationError.from_exception_data("filter", faults)
        return handler(raw)
    return check


# The type of ``online.filter``: a condition tree on a trace, checked whole with the path of
# every fault; and of ``online.spanFilter``: the same language on one span (span scope).
Filter = Annotated[FilterNode, WrapValidator(_checked(TRACE_FIELDS))]
SpanFilter = Annotated[FilterNode, WrapValidator(_checked(SPAN_FIELDS))]


def walk(node: FilterNode) -> list[tuple[Loc, FieldCondition]]:
    """Every leaf of a (valid) filter with its path: for the checks only the server can make."""
    found: list[tuple[Loc, FieldCondition]] = []
    stack: list[tuple[FilterNode, Loc]] = [(node, ())]
    while stack:
        current, loc = stack.pop()
        if isinstance(current, FieldCondition):
            found.append((loc, current))
        elif isinstance(current, NotOf):
            stack.append((current.not_, (*loc, "not")))
        else:
            kind = "all" if isinstance(current, AllOf) else "any"
            children = current.all if isinstance(current, AllOf) else current.any
            stack.extend((child, (*loc, kind, i)) for i, child in enumerate(children))
    return sorted(found, key=lambda item: [str(p) for p in item[0]])


Evaluator = Callable[[Any], "bool | None"]
