"""A plain reading of ``online.filter``'s rules, written from the issue's words on the trace's raw
JSON (not the decoded model, not the compiled closures), for the property tests to hold the
evaluator against. Slow and obvious on purpose."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

_ABSENT = object()


def _text(value: Any) -> Any:
    if value is None:
        return _ABSENT
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _at_path(obj: Any, path: str) -> Any:
    """Dots walk into nested objects; a key that holds dots is found too (the longer key first)."""
    if not isinstance(obj, dict):
        return _ABSENT
    parts = path.split(".")
    for cut in reversed(range(1, len(parts) + 1)):
        key, rest = ".".join(parts[:cut]), ".".join(parts[cut:])
        if key not in obj:
            continue
        if not rest:
            if obj[key] is not None:  # a null key is no value: a shorter key may still lead to one
                return obj[key]
            continue
        found = _at_path(obj[key], rest)
        if found is not _ABSENT:
            return found
    return _ABSENT


def _root(trace: dict[str, Any]) -> dict[str, Any]:
    for span in trace["spans"]:
        if not span.get("parentSpanId"):
            return span
    return trace["spans"][0]


def _values(trace: dict[str, Any], field: str) -> tuple[bool, list[Any]]:
    """(is it a spans field, its value or values); a missing value is _ABSENT."""
    root = _root(trace)
    if field == "agentId":
        return False, [trace["agentId"]]
    if field == "traceId":
        return False, [trace["traceId"]]
    if field == "sessionId":
        return False, [trace.get("sessionId") or _ABSENT]
    if field == "root.name":
        return False, [root.get("name", "")]
    if field == "root.input":
        return False, [_text(root.get("input"))]
    if field == "root.output":
        return False, [_text(root.get("output"))]
    if field == "durationMs":
        if root.get("startTime") is None or root.get("endTime") is None:
            return False, [_ABSENT]
        start = datetime.fromisoformat(root["startTime"])
        end = datetime.fromisoformat(root["endTime"])
        return False, [(end - start).total_seconds() * 1000]
    if field.startswith("metadata."):
        return False, [_at_path(trace.get("metadata", {}), field[len("metadata."):])]
    if field == "spans.name":
        return True, [s.get("name", "") for s in trace["spans"]]
    if field == "spans.kind":
        return True, [s.get("kind") if s.get("kind") is not None else _ABSENT for s in trace["spans"]]
    if field.startswith("spans.attributes."):
        return True, [_at_path(s.get("attributes", {}), field[len("spans.attributes."):]) for s in trace["spans"]]
    raise AssertionError(field)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return a == b
    return False


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _holds(op: str, x: Any, v: Any) -> bool:
    present = x is not _ABSENT
    if op == "exists":
        return present == v
    if op == "eq":
        return present and _same(x, v)
    if op == "neq":
        return not (present and _same(x, v))
    if op == "in":
        return present and any(_same(x, w) for w in v)
    if op == "nin":
        return not (present and any(_same(x, w) for w in v))
    if op == "contains":
        if isinstance(x, str):
            return isinstance(v, str) and v in x
        return isinstance(x, list) and any(_same(e, v) for e in x)
    if op == "startsWith":
        return isinstance(x, str) and x.startswith(v)
    if op == "matches":
        return isinstance(x, str) and re.search(v, x) is not None  # the tests' regexes mean the same in RE2
    if not _number(x):
        return False
    return {"gt": x > v, "gte": x >= v, "lt": x < v, "lte": x <= v}[op]


def reference_passes(trace: dict[str, Any], condition: dict[str, Any]) -> bool:
    if "all" in condition:
        return all(reference_passes(trace, c) for c in condition["all"])
    if "any" in condition:
        return any(reference_passes(trace, c) for c in condition["any"])
    if "not" in condition:
        return not reference_passes(trace, condition["not"])
    over_spans, values = _values(trace, condition["field"])
    if over_spans:  # true when some span satisfies it
        return any(_holds(condition["op"], x, condition["value"]) for x in values)
    return _holds(condition["op"], values[0], condition["value"])
