"""What members read: trace scope, and sessions split by speaker with the spec's fallbacks."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import orjson
from pydantic import TypeAdapter

from scoring.subjects import Span, Trace, session_subject, span_dicts, trace_subject

SPANS = TypeAdapter(tuple[Span, ...])  # the wire model's own serializer: what span_dicts must write


def trace(n: int, *, user: str | None = "", agent: str | None = "", children: list[dict[str, Any]] = (),
          **over: Any) -> Trace:
    spans = [{"spanId": f"r{n}", "parentSpanId": None, "name": "agent.run", "input": user, "output": agent}]
    spans += [{"spanId": f"c{n}-{i}", "parentSpanId": f"r{n}", **c} for i, c in enumerate(children)]
    doc = {"traceId": f"t-{n}", "projectId": "p-1", "agentId": "a-1", "sessionId": "s-1",
           "timestamp": f"2026-12-02T13:00:{n:02d}Z", "spans": spans, **over}
    return Trace.model_validate(doc)


def test_trace_scope_reads_the_root_span() -> None:
    s = trace_subject(trace(1, user="What is 2+2?", agent="4", expected="4", metadata={"k": 1}))
    assert (s.scope, s.input, s.output, s.expected, s.metadata) == ("trace", "What is 2+2?", "4", "4", {"k": 1})
    assert [sp["spanId"] for sp in s.member_payload()["spans"]] == ["r1"]
    assert s.member_payload().keys() == {"input", "output", "expected", "spans", "metadata"}
    # Made JSON-shaped only when a code or external member reads them: groups of judges and
    # patterns never pay for it.
    assert all(isinstance(span, Span) for span in s.spans)


def test_structured_span_values_become_json_text() -> None:
    s = trace_subject(trace(1, user={"messages": [{"role": "user", "content": "hi"}]}, agent=["a", 1]))
    assert s.input == '{"messages":[{"role":"user","content":"hi"}]}'
    assert s.output == '["a",1]'


def test_session_splits_by_speaker_reading_roots_first() -> None:
    turns = [trace(2, user="Second question", agent="Second answer"),
             trace(1, user="First question", agent="First answer",
                   children=[{"kind": "llm", "output": "child words"}])]
    s = session_subject(turns)
    assert s.scope == "session" and s.turns == 2
    assert s.input == "First question\n\nSecond question", "every user turn joined, in time order"
    assert s.output == "First answer\n\nSecond answer", "every agent turn joined; roots win over children"
    assert "User: First question" in s.transcript and "Agent: Second answer" in s.transcript
    assert s.transcript.index("Turn 1") < s.transcript.index("First question")


def test_session_patterns_never_see_the_users_words_as_output() -> None:
    s = session_subject([trace(1, user="I am so sorry to bother you", agent="Happy to help"),
                         trace(2, user="Sorry again", agent="No problem")])
    assert "sorry" not in s.output.lower()


def test_otel_session_user_side_falls_back_to_transcript_agent_side_to_child_outputs() -> None:
    turns = [trace(1, user=None, agent=None, children=[
                 {"kind": "llm", "input": "prompt one", "output": "reply one"},
                 {"kind": "tool", "name": "search", "input": "q", "output": "TOOL RESULT"}]),
             trace(2, user=None, agent=None, children=[{"kind": "llm", "input": "prompt two",
                                                        "output": "reply two"}])]
    s = session_subject(turns)
    assert s.input == s.transcript, "the user side falls back to the whole formatted transcript"
    assert "prompt one" in s.input
    assert s.output == "reply one\n\nreply two", "the agent side falls back to child span outputs"
    assert "TOOL RESULT" not in s.output and "TOOL RESULT" not in s.input, "tool calls are not passed"


def test_otel_session_agent_side_stays_empty_without_child_outputs() -> None:
    s = session_subject([trace(1, user=None, agent=None, children=[{"kind": "llm", "input": "asked"}]),
                         trace(2, user=None, agent=None,
                               children=[{"kind": "tool", "output": "only a tool said this"}])])
    assert s.output == ""
    assert "asked" in s.input


def test_code_scorer_spans_cover_only_the_anchor_trace() -> None:
    s = session_subject([trace(1, user="a", agent="b"), trace(3, user="e", agent="f"),
                         trace(2, user="c", agent="d", children=[{"kind": "llm", "output": "x"}])])
    assert [sp["spanId"] for sp in s.member_payload()["spans"]] == ["r3"], "the last trace in time is the anchor"
    assert s.trace_id == "t-3" and s.metadata["turns"] == 3


def test_root_is_the_span_without_a_parent_wherever_it_stands() -> None:
    t = Trace.model_validate({
        "traceId": "t", "projectId": "p", "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
        "spans": [{"spanId": "c", "parentSpanId": "r", "output": "child"},
                  {"spanId": "r", "input": "question", "output": "answer"}]})
    assert trace_subject(t).output == "answer"


def test_a_time_without_a_zone_is_read_as_utc_whatever_the_hosts_zone(monkeypatch: Any) -> None:
    # The claim's day comes from trace.timestamp.timestamp(): a naive time would be read in the
    # host's zone, so two workers in different zones would keep the same trace under two days.
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        naive = trace(1, timestamp="2026-12-02T23:30:00")
        aware = trace(2, timestamp="2026-12-02T23:30:00+02:00")
        assert naive.timestamp.tzinfo is UTC
        assert naive.timestamp.timestamp() == datetime(2026, 12, 2, 23, 30, tzinfo=UTC).timestamp()
        assert aware.timestamp.utcoffset() == timedelta(hours=2), "a time with its zone keeps it"
        span = trace(3, children=[{"startTime": "2026-12-02T23:30:00"}]).spans[1]
        assert span.start_time is not None and span.start_time.tzinfo is UTC
        # Turns of one session mixing both still order (by UTC): the aware one is 21:30 UTC, so
        # the naive one is the last turn, the session's anchor.
        assert session_subject([naive, aware]).trace_id == "t-1"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()



def _json_value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 2 or roll < 0.3:
        return rng.choice([None, 1, -5, 0.1, 1e300, "x", "é\u2028", True, False, "", 2**62])
    if roll < 0.6:
        return [_json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "b", "c d", "é"]): _json_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def _time(rng: random.Random) -> str | datetime | None:
    zone = rng.choice([None, UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-8, minutes=-30)),
                       timezone(timedelta(0), "GMT")])
    at = datetime(2026, 12, rng.randint(1, 28), rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59),
                  rng.choice([0, 1, 500_000, 999_999]), tzinfo=zone)
    return rng.choice([None, at, at.isoformat()])


def test_spans_as_members_read_them_are_what_the_span_model_serializes() -> None:
    # span_dicts builds them by hand (the serializer was a share of a trace's CPU): the model
    # stays the wire's definition, and every field of it, set or not, must come out the same.
    every_field = Span.model_validate({name: "x" for name in Span.model_fields} | {
        "span_id": "s", "attributes": {"k": [1, None]}, "start_time": "2026-12-02T13:00:00.5Z",
        "end_time": "2026-12-02T13:00:00+02:00"})
    assert set(span_dicts((every_field,))[0]) == {f.alias or name for name, f in Span.model_fields.items()}
    rng = random.Random(3)
    for _ in range(3000):
        document: dict[str, Any] = {"spanId": rng.choice(["s", "r1"])}
        for name in ("parentSpanId", "kind"):
            if rng.random() < 0.5:
                document[name] = rng.choice([None, "p", "", "x y"])
        if rng.random() < 0.5:
            document["name"] = rng.choice(["", "n"])
        for name in ("input", "output"):
            if rng.random() < 0.7:
                document[name] = _json_value(rng)
        if rng.random() < 0.7:
            document["attributes"] = {"k": _json_value(rng)}
        for name in ("startTime", "endTime"):
            document[name] = _time(rng)
        spans = tuple(Span.model_validate(document) for _ in range(rng.randint(1, 3)))
        expected = SPANS.dump_python(spans, mode="json", by_alias=True, exclude_none=True)
        assert span_dicts(spans) == list(expected), document
        assert orjson.dumps(span_dicts(spans)) == orjson.dumps(list(expected))
