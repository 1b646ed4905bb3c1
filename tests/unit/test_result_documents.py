"""The documents a result becomes are built without re-validation on the hot path: they must be
exactly what the validated wire models would be, and their ids exactly the documented UUIDv5s."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
from hypothesis import given
from hypothesis import strategies as st

from scoring.blend import MemberOutcome, blend
from scoring.models import ScorerGroup
from scoring.panel import GroupResult
from scoring.results import _IDS, Rating, Signal, build_rating, build_signal, derived_id
from scoring.subjects import Trace, span_subject, trace_subject

GROUP = ScorerGroup.model_validate({
    "id": "g-1", "name": "Quality", "projectId": "p-1",
    "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 7, "severity": "high"},
    "members": [{"kind": "pattern", "refId": "pii", "weight": 1, "gate": True},
                {"kind": "custom", "refId": "len", "weight": 2, "gate": False}]})
TRACE = Trace.model_validate({"traceId": "t-1", "projectId": "p-1", "agentId": "a-1",
                              "timestamp": "2026-12-02T13:00:00Z",
                              "spans": [{"spanId": "s", "input": "hi", "output": "hello"}]})


@given(st.text(max_size=200))
def test_derived_ids_are_the_uuid5_of_the_name(name: str) -> None:
    assert derived_id(name) == str(uuid.uuid5(_IDS, name))


def result(pattern_matched: bool, code_value: float) -> GroupResult:
    outcomes = [MemberOutcome(name="PII", kind="pattern", weight=1, gate=True, ref_id="pii",
                              native=pattern_matched, goodness=0.0 if pattern_matched else 1.0,
                              detail="regex matched in output at offset 3" if pattern_matched else None),
                MemberOutcome(name="Length", kind="custom", weight=2, gate=False, ref_id="len",
                              native=code_value, goodness=code_value)]
    return GroupResult(GROUP, trace_subject(TRACE), blend(outcomes))


def test_a_built_rating_and_signal_serialize_as_their_validated_models() -> None:
    at = datetime(2026, 12, 2, 13, 0, 1, tzinfo=UTC)
    for matched, value in ((False, 0.9), (True, 0.2)):
        rating = build_rating(result(matched, value), "trace", now=at)
        validated = Rating.model_validate(orjson.loads(rating.to_json()))
        assert rating.to_json() == validated.to_json()
        assert orjson.loads(rating.to_json())["id"] == str(uuid.uuid5(_IDS, "rating:g-1:trace:t-1"))
        signal = build_signal(GROUP, rating)
        if matched:  # the gate failed: 0, below the threshold of 7
            assert signal is not None
            assert signal.to_json() == Signal.model_validate(orjson.loads(signal.to_json())).to_json()
            assert orjson.loads(signal.to_json())["ratingId"] == rating.id
        else:
            assert signal is None


def test_every_kind_of_member_entry_encodes_as_the_validated_model() -> None:
    """A sample of every member status (scored, failed, not scored, skipped), a judge's usage and
    every scope encodes exactly as the validated model reads it back: the contract holds for
    whatever the hot path builds (and for any faster encoder put in its place)."""
    from scoring.ports import TokenUsage

    outcomes = [
        MemberOutcome(name="Judge", kind="judge", weight=1, gate=False, ref_id="j", native=7.5, goodness=0.75,
                      detail="Fine.", usage=TokenUsage(120, None)),
        MemberOutcome(name="Broken", kind="custom", weight=1, gate=False, ref_id="c", error="ZeroDivisionError"),
        MemberOutcome(name="Gone", kind="pattern", weight=1, gate=False, ref_id="p", error="reference deleted"),
        MemberOutcome(name="Later", kind="judge", weight=1, gate=False, ref_id="k", skipped="not called"),
        MemberOutcome(name="Flag", kind="custom", weight=1, gate=False, ref_id="b", native=True, goodness=1.0),
    ]
    at = datetime(2026, 12, 2, 13, 0, 1, tzinfo=UTC)
    session = trace_subject(TRACE).__class__(scope="session", input="", output="", expected=None, spans=[],
                                             metadata={}, transcript="u: hi", turns=3, project_id="p-1",
                                             agent_id="a-1", session_id="s-1")
    for subject, scope, dataset in ((trace_subject(TRACE), "trace", None), (session, "session", None),
                                    (trace_subject(TRACE), "dataset", ("run-1", 4)),
                                    (trace_subject(TRACE), "playground", None)):
        rating = build_rating(GroupResult(GROUP, subject, blend(outcomes)), scope, now=at, dataset=dataset)  # type: ignore[arg-type]
        encoded = rating.to_json()
        validated = Rating.model_validate(orjson.loads(encoded))
        assert encoded == validated.to_json(), scope
        members = orjson.loads(encoded)["members"]
        assert [m["status"] for m in members] == ["scored", "failed", "not_scored", "skipped", "scored"]
        assert members[0]["usage"] == {"promptTokens": 120, "completionTokens": None}
        assert all("usage" not in m for m in members[1:]), "no usage key where no judge reported one"


def _sample_outcomes() -> list[MemberOutcome]:
    from scoring.ports import TokenUsage

    return [
        MemberOutcome(name="Judge", kind="judge", weight=1, gate=False, ref_id="j", native=7, goodness=0.7,
                      detail="Fine.", usage=TokenUsage(120, None)),
        MemberOutcome(name="Broken", kind="custom", weight=1.5, gate=True, ref_id="c", error="ZeroDivisionError"),
        MemberOutcome(name="Gone", kind="pattern", weight=1, gate=False, ref_id="p", error="reference deleted"),
        MemberOutcome(name="Later", kind="judge", weight=1, gate=False, ref_id="k", skipped="not called"),
        MemberOutcome(name="Flag", kind="custom", weight=0, gate=False, ref_id="b", native=True, goodness=1),
        MemberOutcome(name="PII", kind="pattern", weight=2, gate=True, ref_id="e", native=False, goodness=1.0,
                      detail="template email did not match the output"),
    ]


def _session_subject() -> object:
    return trace_subject(TRACE).__class__(scope="session", input="", output="", expected=None, spans=[], metadata={},
                                          transcript="u: hi", turns=3, project_id="p-1", agent_id="a-1",
                                          session_id="s-1")


def test_the_hot_path_encoder_writes_exactly_what_the_validated_model_writes() -> None:
    """``encode_rating`` (orjson, no pydantic) against ``build_rating(...).to_json()``, byte for byte:
    every member status, an int verdict and a boolean, usage present and absent, a gate that could
    not score (no score), a failed gate (0) and a blend, at trace, session and playground scope."""
    from scoring.results import encode_rating

    at = datetime(2026, 12, 2, 13, 0, 1, 5, tzinfo=UTC)
    outcomes = _sample_outcomes()
    blends = [outcomes, outcomes[2:], outcomes[4:], [outcomes[5].__class__(**{**_fields(outcomes[5]), "native": True,
                                                                             "goodness": 0.0})]]
    step = Trace.model_validate({**TRACE.model_dump(by_alias=True), "spans": [
        {"spanId": "r", "name": "agent.run", "input": "q", "output": "a"},
        {"spanId": "t", "parentSpanId": "r", "name": "lookup", "kind": "tool", "output": "x"}]})
    for subject, scope in ((trace_subject(TRACE), "trace"), (_session_subject(), "session"),
                           (trace_subject(TRACE), "playground"), (span_subject(step, step.spans[1]), "span")):
        for members in blends:
            result = GroupResult(GROUP, subject, blend(members))  # type: ignore[arg-type]
            encoded = encode_rating(result, scope, now=at)  # type: ignore[arg-type]
            model = build_rating(result, scope, now=at)  # type: ignore[arg-type]
            assert encoded.document == model.to_json(), (scope, [m.name for m in members])
            assert model.origin == ("live" if scope != "playground" else None), "traffic is live; an example is not"
            assert (encoded.id, encoded.rating, encoded.reason, encoded.justification, encoded.scored_at,
                    encoded.trace_id, encoded.session_id, encoded.agent_id) == (
                model.id, model.rating, model.reason, model.justification, model.scored_at, model.trace_id,
                model.session_id, model.agent_id)


def _fields(outcome: MemberOutcome) -> dict[str, object]:
    return {name: getattr(outcome, name) for name in outcome.__slots__}  # type: ignore[attr-defined]


@given(st.text(max_size=80), st.text(max_size=80), st.floats(0, 1), st.floats(0, 10), st.booleans())
def test_any_text_and_value_encodes_as_the_model_does(name: str, detail: str, code: float, judge: float,
                                                      gate: bool) -> None:
    """Tenant and model text of any kind (non-ASCII, control characters, quotes) and any verdict
    on its scale."""
    from scoring.results import encode_rating

    at = datetime(2026, 12, 2, 13, 0, 1, tzinfo=UTC)
    members = [MemberOutcome(name=name, kind="custom", weight=1, gate=gate, ref_id="c", native=code, goodness=code),
               MemberOutcome(name="J", kind="judge", weight=2, gate=False, ref_id="j", native=judge,
                             goodness=judge / 10, detail=detail)]
    result = GroupResult(GROUP, trace_subject(TRACE), blend(members))
    assert encode_rating(result, "trace", now=at).document == build_rating(result, "trace", now=at).to_json()


def test_a_lone_surrogate_in_a_verdict_is_replaced_not_a_failed_publish() -> None:
    """A judge's JSON answer may carry "\\ud800", which no UTF-8 encoder takes (pydantic raises):
    the rating is published with U+FFFD in its place, and what Signals read is encodable too."""
    from scoring.results import encode_rating

    at = datetime(2026, 12, 2, 13, 0, 1, tzinfo=UTC)
    members = [MemberOutcome(name="J", kind="judge", weight=1, gate=False, ref_id="j", native=5, goodness=0.5,
                             detail="half \ud800 a pair")]
    result = GroupResult(GROUP, trace_subject(TRACE), blend(members))
    encoded = encode_rating(result, "trace", now=at)
    assert orjson.loads(encoded.document)["members"][0]["detail"] == "half \ufffd a pair"
    assert Rating.model_validate_json(encoded.document).members[0].detail == "half \ufffd a pair"


def test_a_backfilled_result_counts_at_its_traces_own_time() -> None:
    """Issue 42: a backfill's history entry lands in the bucket of the trace's time (the chart
    fills in the past); a live one in the bucket of when it was scored."""
    from scoring.results import history_entry

    subject = trace_subject(TRACE)
    assert subject.at == TRACE.timestamp.timestamp()
    at = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    rating = build_rating(GroupResult(GROUP, subject, blend(_sample_outcomes()[:2])), "trace", now=at)  # type: ignore[arg-type]
    assert history_entry(GROUP, rating).at == at.timestamp()  # type: ignore[arg-type]
    assert history_entry(GROUP, rating, at=subject.at).at == TRACE.timestamp.timestamp()  # type: ignore[arg-type]
