"""``online.filter``: the compiled evaluator against a plain reference over random traces and
filters, the header view's decisions against the full trace's, and every save-time rule with
the path of its fault."""

from __future__ import annotations

import copy
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from consumers.traces import TraceConsumer
from scorer_groups.filters import MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH
from scoring.catalog import CatalogSnapshot, group_errors
from scoring.errors import field_errors
from scoring.filters import HeaderView, TraceView, compile_filter, routing_headers
from scoring.models import ScorerGroup
from scoring.routing import route
from scoring.subjects import Trace
from tests.support.filter_reference import reference_passes
from tests.support.sampling_reference import reference_keep

# --- Random traces and filters over a small world, so that conditions often hold -----------------

WORDS = ["a", "b", "bot", "prod", "staging", "gpt-4o", "llm", "tool", "x.y"]
SCALARS = st.one_of(st.sampled_from(WORDS), st.integers(-3, 3), st.sampled_from([0.5, 2.0, 1.0]), st.booleans())
META_KEYS = ["env", "tier", "a", "a.b", "tags", "n"]
ATTR_KEYS = ["gen_ai.request.model", "gen_ai", "openinference.span.kind", "k"]

json_values = st.recursive(st.one_of(SCALARS, st.none()),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.sampled_from(["b", "c", "env"]), inner,
                                                                   max_size=2)),
                           max_leaves=6)


@st.composite
def traces(draw: st.DrawFn) -> dict[str, Any]:
    spans = []
    count = draw(st.integers(1, 4))
    for i in range(count):
        span: dict[str, Any] = {"spanId": f"s{i}", "name": draw(st.sampled_from(WORDS))}
        if i:
            span["parentSpanId"] = "s0"
        if draw(st.booleans()):
            span["kind"] = draw(st.sampled_from(["llm", "tool", "retriever"]))
        span["attributes"] = draw(st.dictionaries(st.sampled_from(ATTR_KEYS), json_values, max_size=3))
        for side in ("input", "output"):
            if draw(st.booleans()):
                span[side] = draw(st.one_of(st.sampled_from(WORDS), st.dictionaries(st.sampled_from(["q"]),
                                                                                     st.sampled_from(WORDS))))
        if draw(st.booleans()):
            span["startTime"] = "2026-12-05T10:00:00+00:00"
            span["endTime"] = f"2026-12-05T10:00:0{draw(st.integers(0, 9))}.{draw(st.integers(0, 999)):03d}+00:00"
        spans.append(span)
    trace: dict[str, Any] = {"traceId": draw(st.sampled_from(["t1", "t2", "bot"])), "projectId": "p",
                             "agentId": draw(st.sampled_from(WORDS)), "timestamp": "2026-12-05T10:00:00Z",
                             "spans": spans,
                             "metadata": draw(st.dictionaries(st.sampled_from(META_KEYS), json_values, max_size=4))}
    if draw(st.booleans()):
        trace["sessionId"] = draw(st.sampled_from(["s-1", "bot"]))
    return trace


FIELDS = ["agentId", "sessionId", "traceId", "root.name", "root.input", "root.output", "durationMs",
          "spans.name", "spans.kind", *[f"metadata.{k}" for k in [*META_KEYS, "a.b.c", "env.b"]],
          *[f"spans.attributes.{k}" for k in [*ATTR_KEYS, "gen_ai.request"]]]


@st.composite
def leaves(draw: st.DrawFn) -> dict[str, Any]:
    field = draw(st.sampled_from(FIELDS))
    numeric = field == "durationMs"
    ops = ["eq", "neq", "in", "nin", "exists", "gt", "gte", "lt", "lte"]
    if not numeric:
        ops += ["contains", "startsWith", "matches"]
    op = draw(st.sampled_from(ops))
    number = st.one_of(st.integers(-3, 5000), st.sampled_from([0.5, 2.0]))
    scalar = number if numeric else SCALARS
    value: Any
    if op == "exists":
        value = draw(st.booleans())
    elif op in ("in", "nin"):
        value = draw(st.lists(scalar, min_size=1, max_size=4))
    elif op in ("gt", "gte", "lt", "lte"):
        value = draw(number)
    elif op == "startsWith":
        value = draw(st.sampled_from(["b", "st", "gpt", "{"]))
    elif op == "matches":
        value = draw(st.sampled_from(["^b", "o$", "4o", "[0-9]", "prod|stag"]))
    else:
        value = draw(scalar)
    return {"field": field, "op": op, "value": value}


filters = st.recursive(leaves(), lambda inner: st.one_of(
    st.builds(lambda c: {"all": c}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda c: {"any": c}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda c: {"not": c}, inner)), max_leaves=8)


def profile(condition: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    online: dict[str, Any] = {"enabled": True, "sampleRate": 1, "alertThreshold": 5, "severity": "low", **extra}
    if condition is not None:
        online["filter"] = condition
    return online


def group_of(condition: dict[str, Any] | None, gid: str = "g", **extra: Any) -> ScorerGroup:
    return ScorerGroup.model_validate({"id": gid, "name": gid, "projectId": "p",
                                       "members": [{"kind": "pattern", "refId": "x", "weight": 1}],
                                       "online": profile(condition, **extra)})


def depth(condition: dict[str, Any]) -> int:
    for kind in ("all", "any"):
        if kind in condition:
            return 1 + max(depth(c) for c in condition[kind])
    return 1 + depth(condition["not"]) if "not" in condition else 0


def leaf_count(condition: dict[str, Any]) -> int:
    for kind in ("all", "any"):
        if kind in condition:
            return sum(leaf_count(c) for c in condition[kind])
    return leaf_count(condition["not"]) if "not" in condition else 1


# --- The evaluator against the reference ---------------------------------------------------------


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=traces(), condition=filters)
def test_the_compiled_filter_decides_as_the_plain_reference(trace: dict[str, Any], condition: dict[str, Any]) -> None:
    if depth(condition) > MAX_FILTER_DEPTH or leaf_count(condition) > MAX_FILTER_CONDITIONS:
        return  # refused at save time (tested below)
    group = group_of(condition)
    assert group.online is not None and group.online.filter is not None
    decide = compile_filter(group.online.filter)
    expected = reference_passes(trace, condition)
    assert decide(TraceView(Trace.model_validate(trace))) is expected, (trace, condition)


@settings(max_examples=400, deadline=None)
@given(trace=traces(), condition=filters)
def test_what_the_headers_decide_is_what_the_trace_decides(trace: dict[str, Any], condition: dict[str, Any]) -> None:
    """A record is skipped unparsed only on a sure "no": the header view may say "cannot tell",
    never the opposite of the trace."""
    if depth(condition) > MAX_FILTER_DEPTH or leaf_count(condition) > MAX_FILTER_CONDITIONS:
        return
    group = group_of(condition)
    assert group.online is not None and group.online.filter is not None
    decoded = Trace.model_validate(trace)
    decide = compile_filter(group.online.filter)
    headers = {name: value.decode() for name, value in routing_headers(decoded)}
    from_headers = decide(HeaderView(headers))
    assert from_headers is None or from_headers is decide(TraceView(decoded))


def test_headers_decide_the_fields_they_carry_and_leave_the_rest_open() -> None:
    decoded = Trace.model_validate({"traceId": "t", "projectId": "p", "agentId": "internal-bot",
                                    "timestamp": "2026-12-05T10:00:00Z",
                                    "spans": [{"spanId": "r", "name": "health-check"}],
                                    "metadata": {"environment": "production"}})
    view = HeaderView({name: value.decode() for name, value in routing_headers(decoded)})
    agent = group_of({"field": "agentId", "op": "neq", "value": "internal-bot"}).online
    env = group_of({"field": "metadata.environment", "op": "eq", "value": "production"}).online
    both = group_of({"all": [{"field": "metadata.environment", "op": "eq", "value": "production"},
                             {"field": "root.name", "op": "startsWith", "value": "health"},
                             {"not": {"field": "sessionId", "op": "exists", "value": True}}]}).online
    assert agent and agent.filter and env and env.filter and both and both.filter
    assert compile_filter(agent.filter)(view) is False, "the agent is in the headers: decided"
    assert compile_filter(env.filter)(view) is None, "metadata is not: cannot tell"
    assert compile_filter(both.filter)(view) is None
    assert compile_filter(both.filter)(TraceView(decoded)) is True


# --- Semantics the reference shares, pinned by name ---------------------------------------------------

TRACE = {"traceId": "t-1", "projectId": "p", "agentId": "support", "timestamp": "2026-12-05T10:00:00Z",
         "metadata": {"environment": "production", "customer": {"tier": "gold"}, "tags": ["vip", 3],
                      "release.version": "2.1", "nothing": None},
         "spans": [{"spanId": "r", "name": "answer", "input": {"q": "refund?"}, "output": "Sure.",
                    "startTime": "2026-12-05T10:00:00Z", "endTime": "2026-12-05T10:00:01.5Z"},
                   {"spanId": "c", "parentSpanId": "r", "name": "chat", "kind": "llm",
                    "attributes": {"gen_ai.request.model": "gpt-4o-mini", "gen_ai.usage.input_tokens": 12}},
                   {"spanId": "k", "parentSpanId": "r", "name": "lookup", "kind": "tool"}]}


def passes(condition: dict[str, Any]) -> bool | None:
    online = group_of(condition).online
    assert online is not None and online.filter is not None
    return compile_filter(online.filter)(TraceView(Trace.model_validate(TRACE)))


@pytest.mark.parametrize(("condition", "expected"), [
    ({"field": "metadata.environment", "op": "eq", "value": "production"}, True),
    ({"field": "metadata.customer.tier", "op": "in", "value": ["gold", "platinum"]}, True),
    ({"field": "metadata.release.version", "op": "eq", "value": "2.1"}, True),  # a key that holds a dot
    ({"field": "metadata.tags", "op": "contains", "value": "vip"}, True),  # member of a list
    ({"field": "metadata.tags", "op": "contains", "value": "3"}, False),  # "3" is not 3
    ({"field": "root.input", "op": "contains", "value": "refund"}, True),  # structures read as JSON text
    ({"field": "root.output", "op": "matches", "value": "^Sure"}, True),
    ({"field": "durationMs", "op": "gte", "value": 1500}, True),
    ({"field": "durationMs", "op": "gt", "value": 1500}, False),
    ({"field": "spans.attributes.gen_ai.request.model", "op": "startsWith", "value": "gpt-4o"}, True),
    ({"field": "spans.attributes.gen_ai.usage.input_tokens", "op": "lt", "value": 100}, True),
    ({"field": "spans.kind", "op": "eq", "value": "tool"}, True),  # some span is a tool
    ({"not": {"field": "spans.kind", "op": "eq", "value": "tool"}}, False),  # "no span is a tool"
    ({"field": "agentId", "op": "eq", "value": True}, False),  # a boolean is never a string
    # A missing field matches nothing but exists: false, neq and nin; null is missing.
    *[({"field": f, "op": op, "value": v}, expected)
      for f in ("sessionId", "metadata.nothing", "metadata.customer.region", "metadata.environment.x")
      for op, v, expected in (("eq", "x", False), ("contains", "x", False), ("startsWith", "x", False),
                              ("matches", ".", False), ("in", ["x"], False), ("exists", True, False),
                              ("exists", False, True), ("neq", "x", True), ("nin", ["x"], True))],
    ({"field": "metadata.customer.tier", "op": "gt", "value": 1}, False),  # a string is not ordered
    ({"field": "metadata.customer.tier", "op": "eq", "value": "gold"}, True),
])
def test_each_op_on_each_kind_of_field(condition: dict[str, Any], expected: bool) -> None:
    assert passes(condition) is expected
    assert reference_passes(TRACE, condition) is expected, "the reference reads the rules the same"


# --- Save-time rules, each with the path of its fault ----------------------------------------------


def refusal(condition: Any) -> list[str]:
    with pytest.raises(ValidationError) as caught:
        group_of(condition)
    return field_errors(caught.value)


LEAF = {"field": "agentId", "op": "eq", "value": "a"}


def nested(levels: int) -> dict[str, Any]:
    condition: dict[str, Any] = LEAF
    for _ in range(levels):
        condition = {"not": condition}
    return condition


@pytest.mark.parametrize(("condition", "path", "says"), [
    ({"all": [LEAF, {**LEAF, "op": "equals"}]}, "online.filter.all[1].op", "must be one of eq, neq"),
    ({"any": [LEAF, {"not": {**LEAF, "field": "user.name"}}]}, "online.filter.any[1].not.field",
     "'user.name' is not a field of a trace"),
    ({"field": "metadata.", "op": "exists", "value": True}, "online.filter.field", "needs a key after the dot"),
    ({"field": "metadata.a..b", "op": "exists", "value": True}, "online.filter.field", "without empty parts"),
    ({"field": "durationMs", "op": "gt", "value": "1s"}, "online.filter.value", "gt compares numbers"),
    ({"field": "durationMs", "op": "contains", "value": 5}, "online.filter.value", "durationMs is a number"),
    ({"field": "agentId", "op": "in", "value": "a"}, "online.filter.value", "in takes a non-empty list"),
    ({"field": "agentId", "op": "in", "value": []}, "online.filter.value", "in takes a non-empty list"),
    ({"field": "agentId", "op": "nin", "value": ["a", None]}, "online.filter.value", "no null"),
    ({"field": "agentId", "op": "exists", "value": "yes"}, "online.filter.value", "exists takes true or false"),
    ({"field": "agentId", "op": "eq", "value": None}, "online.filter.value", "for a missing field use exists"),
    ({"field": "agentId", "op": "eq", "value": {"a": 1}}, "online.filter.value", "a string, a number or a boolean"),
    ({"field": "agentId", "op": "startsWith", "value": ""}, "online.filter.value", "a non-empty string"),
    ({"field": "durationMs", "op": "lt", "value": float("inf")}, "online.filter.value", "compares numbers"),
    ({"field": "spans.attributes.a.b.c.d.e.f.g.h.i", "op": "exists", "value": True}, "online.filter.field",
     "at most 8 dot-separated parts"),
    ({"field": "agentId", "op": "eq"}, "online.filter.value", "eq needs a value"),
    ({"field": "agentId", "op": "eq", "value": "a", "why": 1}, "online.filter.why", "'why' is not a key"),
    ({"all": [LEAF], "any": [LEAF]}, "online.filter", "exactly one of all, any, not"),
    ({"all": []}, "online.filter.all", "non-empty list of conditions"),
    ({"oneOf": [LEAF]}, "online.filter", "exactly one of all, any, not"),
    (nested(MAX_FILTER_DEPTH + 1), "online.filter" + ".not" * (MAX_FILTER_DEPTH + 1),
     f"filters nest at most {MAX_FILTER_DEPTH} levels"),
    ({"any": [LEAF] * (MAX_FILTER_CONDITIONS + 1)}, "online.filter.any", f"at most {MAX_FILTER_CONDITIONS}"),
    ({"all": [{"any": [LEAF] * 20}, {"any": [LEAF] * 20}]}, "online.filter",
     f"at most {MAX_FILTER_CONDITIONS} conditions, this one has 40"),
])
def test_each_save_time_rule_names_the_path_of_its_fault(condition: Any, path: str, says: str) -> None:
    errors = refusal(condition)
    assert any(e.startswith(f"{path}: ") and says in e for e in errors), errors


def test_a_thousand_levels_of_nesting_is_refused_not_a_stack_overflow() -> None:
    errors = refusal(nested(1000))
    assert len(errors) == 1 and "nest at most" in errors[0]


def test_a_regex_re2_refuses_is_refused_at_save_with_its_path() -> None:
    group = group_of({"any": [LEAF, {"field": "root.output", "op": "matches", "value": r"(a)\1"}]})
    errors = group_errors(group, CatalogSnapshot(), None)
    assert errors and errors[0].startswith("online.filter.any[1].value: regex is not supported"), errors
    fine = group_errors(group_of({"field": "root.output", "op": "matches", "value": "(a|b)+"}), CatalogSnapshot(), None)
    assert not [e for e in fine if e.startswith("online")]


def test_a_filter_round_trips_on_the_wire_and_null_removes_it() -> None:
    condition = {"all": [{"field": "spans.attributes.gen_ai.request.model", "op": "in", "value": ["a", "b"]},
                         {"not": {"field": "metadata.env", "op": "eq", "value": "staging"}}]}
    group = group_of(condition)
    assert group.wire()["online"]["filter"] == condition  # type: ignore[index]
    assert ScorerGroup.model_validate(group.stored()) == group
    assert "filter" not in (group_of(None).wire()["online"])  # type: ignore[operator]


# --- Routing: the filter first, then the sample -------------------------------------------------------


def test_routing_decides_the_filter_before_the_sample_and_says_which_groups_matched() -> None:
    prod = group_of({"field": "metadata.environment", "op": "eq", "value": "production"}, "prod")
    staging = group_of({"field": "metadata.environment", "op": "eq", "value": "staging"}, "staging")
    half = group_of({"field": "metadata.environment", "op": "eq", "value": "production"}, "half", sampleRate=0)
    sessions = group_of({"field": "agentId", "op": "eq", "value": "support"}, "conv", scope="session")
    snapshot = CatalogSnapshot(groups={g.id: g for g in (prod, staging, half, sessions)})
    trace = copy.deepcopy(TRACE)
    decided = route(Trace.model_validate(trace), snapshot)
    assert [p.group.id for p in decided.pairs] == ["prod"]
    assert sorted(decided.matched) == ["half", "prod"] and decided.filtered == ["staging"]
    assert decided.turn is False, "no session: nothing to record, and not a matched turn"
    trace["sessionId"] = ""
    assert route(Trace.model_validate(trace), snapshot).turn is False, "an empty session is no session"
    trace["sessionId"] = "s-1"
    with_session = route(Trace.model_validate(trace), snapshot)
    assert with_session.turn is True and sorted(with_session.matched) == ["conv", "half", "prod"]
    trace["agentId"] = "other"
    assert route(Trace.model_validate(trace), snapshot).turn is False, "a turn no session group wants is not recorded"


def test_a_filter_that_no_longer_compiles_matches_nothing() -> None:
    group = group_of({"field": "root.output", "op": "matches", "value": r"(a)\1"})  # RE2 refuses it
    assert group.online is not None and group.online.filter is not None
    assert compile_filter(group.online.filter)(TraceView(Trace.model_validate(TRACE))) is False


def test_a_null_key_holding_dots_does_not_hide_the_nested_value() -> None:
    trace = {**TRACE, "metadata": {"a.b": None, "a": {"b": "x"}}}
    condition = {"field": "metadata.a.b", "op": "eq", "value": "x"}
    online = group_of(condition).online
    assert online is not None and online.filter is not None
    assert compile_filter(online.filter)(TraceView(Trace.model_validate(trace))) is True
    assert reference_passes(trace, condition) is True


def test_a_trace_of_many_spans_under_many_span_conditions_is_bounded_and_fails_closed() -> None:
    """A hostile trace (60,000 spans) under 32 span conditions in each of several groups: each
    span field is read once per trace, the comparisons stop at MAX_SPAN_TESTS, and a condition
    past it is false (the trace is not scored), all in well under a second."""
    spans = [{"spanId": f"s{i}", "parentSpanId": "s0" if i else None, "name": "n",
              "attributes": {"a": {"a": {"a": {"a": {"a": {"a": {"a": "v"}}}}}}}} for i in range(60_000)]
    trace = Trace.model_validate({**TRACE, "spans": spans})
    deep = "spans.attributes." + ".".join(["a"] * 8)
    groups = [group_of({"any": [{"field": deep, "op": "eq", "value": f"w{n}"} for n in range(32)]}, f"g{k}")
              for k in range(10)]
    snapshot = CatalogSnapshot(groups={g.id: g for g in groups})
    view = TraceView(trace)
    started = time.process_time()
    decisions = [snapshot.passes(g, view) for g in groups]
    assert time.process_time() - started < 5.0, "bounded (a few hundred ms here; minutes without the bound)"
    assert decisions == [False] * 10 and view.span_tests_left < 0
    within = group_of({"field": "spans.name", "op": "eq", "value": "n"})
    assert within.online is not None and within.online.filter is not None
    assert compile_filter(within.online.filter)(TraceView(trace)) is True, "one condition on 60,000 spans is fine"


def test_only_complete_routing_headers_decide_and_a_null_or_odd_header_means_parse_it() -> None:
    group = group_of({"field": "sessionId", "op": "exists", "value": True})
    snapshot = CatalogSnapshot(groups={group.id: group})
    full = [("sgw-project", b"p"), ("sgw-agent", b"a"), ("sgw-trace", b"t"), ("sgw-root-name", b"r")]
    counted: Counter[tuple[str, str]] = Counter()
    assert TraceConsumer._unwanted(full, snapshot, counted) is True, "complete, no session: decided unwanted"
    assert counted == {("p", "g"): 1}
    assert TraceConsumer._unwanted([*full, ("sgw-session", b"s")], snapshot, Counter()) is False
    assert TraceConsumer._unwanted([("sgw-project", b"p")], snapshot, Counter()) is False, "incomplete: parse it"
    assert TraceConsumer._unwanted([*full[:3], ("sgw-root-name", None)], snapshot, Counter()) is False, \
        "a null header value (Kafka allows it) is no header, never a crash"
    absent = group_of({"field": "sessionId", "op": "exists", "value": False})
    assert TraceConsumer._unwanted([*full, ("sgw-session", b"")], CatalogSnapshot(groups={absent.id: absent}),
                                   Counter()) is False, "an empty session header is no session, as on the trace"
    other = CatalogSnapshot()
    assert TraceConsumer._unwanted(full, other, Counter()) is True, "a project without live groups wants nothing"


# --- Span scope: the spans a group grades -----------------------------------------------------------


def span_group(span_filter: dict[str, Any], gid: str = "steps", **extra: Any) -> ScorerGroup:
    return group_of(None, gid, scope="span", spanFilter=span_filter, **extra)


def test_a_span_group_grades_each_span_its_span_filter_takes_as_its_own_subject() -> None:
    group = span_group({"any": [{"field": "kind", "op": "eq", "value": "llm"},
                                {"field": "attributes.gen_ai.usage.input_tokens", "op": "gt", "value": 100}]})
    decided = route(Trace.model_validate(TRACE), CatalogSnapshot(groups={group.id: group}))
    (pair,) = decided.pairs
    subject = pair.subject
    assert (subject.scope, subject.span_id, subject.span_name, subject.trace_id) == ("span", "c", "chat", "t-1")
    assert pair.claim.subject_key == "span:3:t-1:c", "claimed per (trace, span, group)"
    assert subject.context == '{"q":"refund?"}', "the trace's request, for a judge's context"
    assert [s.span_id for s in subject.spans] == ["c"], "the span and its descendants"  # type: ignore[union-attr]


def test_span_sampling_is_stable_per_trace_and_span_and_the_cap_counts_the_rest() -> None:
    spans = [{"spanId": "r", "name": "root"}] + [{"spanId": f"s{i}", "parentSpanId": "r", "name": "tool", "kind": "tool"}
                                                 for i in range(400)]
    trace = Trace.model_validate({**TRACE, "spans": spans})
    group = span_group({"field": "kind", "op": "eq", "value": "tool"}, sampleRate=0.5)
    snapshot = CatalogSnapshot(groups={group.id: group})
    kept = [p.subject.span_id for p in route(trace, snapshot, max_spans=1000).pairs]
    assert kept == [f"s{i}" for i in range(400) if reference_keep(f"t-1/s{i}", 0.5)], "the reference's sample"
    assert 150 < len(kept) < 250
    capped = route(trace, snapshot, max_spans=10)
    assert [p.subject.span_id for p in capped.pairs] == kept[:10], "the first in the trace's order"
    assert capped.skipped == {("steps", "span_cap"): len(kept) - 10}


def test_a_span_group_needs_its_span_filter_and_the_span_fields() -> None:
    with pytest.raises(ValidationError) as missing:
        group_of(None, scope="span")
    assert field_errors(missing.value) == [
        'online.spanFilter: required when scope is span: which spans to grade (e.g. {"field": "kind", "op": "eq", '
        '"value": "llm"})']
    with pytest.raises(ValidationError) as wrong:
        span_group({"all": [{"field": "kind", "op": "eq", "value": "llm"}, {"field": "agentId", "op": "eq", "value": "a"}]})
    assert field_errors(wrong.value)[0].startswith("online.spanFilter.all[1].field: 'agentId' is not a field of a span")
    # Under another scope the span filter is kept, inert: flipping back to span finds it again.
    flipped = group_of(None, scope="trace", spanFilter={"field": "kind", "op": "eq", "value": "tool"})
    assert route(Trace.model_validate(TRACE), CatalogSnapshot(groups={flipped.id: flipped})).pairs[0].subject.scope == "trace"


def test_step_keys_never_collide_and_a_steps_name_and_ids_are_bounded() -> None:
    from scoring.claim_request import span_key

    assert span_key("a:b", "c") != span_key("a", "b:c"), "tenant ids holding the separator stay apart"
    named = Trace.model_validate({**TRACE, "spans": [{"spanId": "r", "name": "n" * 5000, "kind": "tool"}]})
    group = span_group({"field": "kind", "op": "eq", "value": "tool"})
    (pair,) = route(named, CatalogSnapshot(groups={group.id: group})).pairs
    assert pair.subject.span_name is not None and len(pair.subject.span_name) == 256, "cut: it goes into every output"
    with pytest.raises(ValidationError, match="spanId"):
        Trace.model_validate({**TRACE, "spans": [{"spanId": "s" * 257}]})


def test_a_chain_of_many_spans_costs_each_step_a_bounded_subtree_and_each_trace_one_index() -> None:
    """A hostile trace: 28,000 spans, each the parent of the next, under five span groups that
    take every span. Each graded step's spans (a code scorer's) stop at MAX_SUBTREE_SPANS, and
    the span views and the children index are built once for all the groups."""
    from scoring.subjects import MAX_SUBTREE_SPANS

    spans = [{"spanId": f"s{i}", "parentSpanId": f"s{i - 1}" if i else None, "name": "step", "kind": "tool"}
             for i in range(28_000)]
    trace = Trace.model_validate({**TRACE, "spans": spans})
    groups = [span_group({"field": "kind", "op": "eq", "value": "tool"}, f"g{k}") for k in range(5)]
    snapshot = CatalogSnapshot(groups={g.id: g for g in groups})
    started = time.process_time()
    decided = route(trace, snapshot, max_spans=50)
    assert time.process_time() - started < 3.0, "a fraction of a second here; 1.3 s per group before"
    assert len(decided.pairs) == 250 and all(len(p.subject.spans) == MAX_SUBTREE_SPANS for p in decided.pairs)
    assert len({id(p.subject) for p in decided.pairs}) == 50, "one subject per step, shared by the groups"
    assert decided.skipped == {(g.id, "span_cap"): 28_000 - 50 for g in groups}


def test_spans_past_the_traces_filter_bound_are_counted_not_graded() -> None:
    spans = [{"spanId": f"s{i}", "name": "step", "kind": "tool"} for i in range(60_000)]
    trace = Trace.model_validate({**TRACE, "spans": spans})
    heavy = {"any": [{"field": "name", "op": "eq", "value": f"no-{n}"} for n in range(10)]}
    group = span_group(heavy)
    decided = route(trace, CatalogSnapshot(groups={group.id: group}))
    assert decided.pairs == [] and decided.skipped == {("steps", "span_budget"): 60_000 - 25_000}
