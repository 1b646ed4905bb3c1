"""The documents a result becomes are built without re-validation on the hot path: they must be
exactly what the validated wire models would be, and their ids exactly the documented UUIDv5s."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scoring.blend import MemberOutcome, blend
from scoring.models import ScorerGroup
from scoring.panel import GroupResult
from scoring.results import Rating, RatingOrigin, Signal, build_rating, build_signal, derived_id
from scoring.subjects import Trace, span_subject, trace_subject

GROUP = ScorerGroup.model_validate({
    "id": "g-1", "name": "Quality", "projectId": "p-1",
    "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 7, "severity": "high"},
    "members": [{"kind": "pattern", "refId": "pii", "weight": 1, "gate": True},
                {"kind": "custom", "refId": "len", "weight": 2, "gate": False}]})
TRACE = Trace.model_validate({"traceId": "t-1", "projectId": "p-1", "agentId": "a-1",
                              "timestamp": "2026-12-02T13:00:00Z",
                              "spans": [{"spanId": "s", "input": "hi", "output": "hello"}]})


# The namespace of every derived id, written out: were it changed, every published id would
# change with it (and consumers deduplicating on them would see every result anew).
ID_NAMESPACE = uuid.UUID("6f1c5a8e-6a8f-4f7e-9a63-2c1d0b7e4a10")
# uuid.uuid5(ID_NAMESPACE, name), worked out once with the standard library.
TRACE_RATING_ID = "e937dc88-6bf6-57e8-972a-59ef0a4ca51f"  # "rating:g-1:trace:t-1"
SESSION_RATING_ID = "504db213-4fdd-51e3-8fbc-0ef3e1bfc021"  # "rating:g-1:session:s-1:3"
SPAN_RATING_ID = "c4213544-659d-5a8d-a0d3-f55a2f4f52b7"  # "rating:g-1:span:3:t-1:t"
DATASET_RATING_ID = "7281fea5-d383-5b9a-85d1-1a4f7c4e9476"  # "rating:g-1:dataset:run-1:4"


@given(st.text(max_size=200))
def test_derived_ids_are_the_uuid5_of_the_name(name: str) -> None:
    assert derived_id(name) == str(uuid.uuid5(ID_NAMESPACE, name))


def test_derived_ids_are_these() -> None:
    assert [derived_id(name) for name in ("", "x", "h\u00e9llo", "rating:g-1:trace:t-1")] == [
        "fdd572a7-b4ab-546b-bdac-c59763665fe6", "7ea14fa2-b430-551a-a600-fcbfd33028ef",
        "b64b93ef-8fae-525a-ac5b-1442a427478c", TRACE_RATING_ID]


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
        assert orjson.loads(rating.to_json())["id"] == TRACE_RATING_ID
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
        assert members[0]["usage"] == {"promptTokens": 120, "completionTokens": None, "cost": None}
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


# A rating of a trace, written out field by field: its blend is the judge (7/10, weight 1), a
# boolean gate of weight 0 and a must-pass pattern that passed (weight 2): (0.7 + 2 x 1.0) / 3.
TRACE_RATING: dict[str, object] = {
    "id": TRACE_RATING_ID, "groupId": "g-1", "groupName": "Quality", "projectId": "p-1", "agentId": "a-1",
    "scope": "trace", "traceId": "t-1", "sessionId": None, "spanId": None, "spanName": None,
    "kind": "scorer-group:g-1", "turns": None, "runId": None, "row": None, "origin": "live",
    "rating": 9.0, "reason": None,
    "justification": "Weighted blend: 9.00/10, must-pass PII passed. Judge 0.70 \u00d7 w1 (33%); Flag 1.00 "
                     "(gate only); PII [must pass] 1.00 \u00d7 w2 (67%)",
    "members": [
        {"kind": "judge", "refId": "j", "name": "Judge", "weight": 1.0, "gate": False, "status": "scored",
         "native": 7.0, "goodness": 0.7, "detail": "Fine.", "usage": {"promptTokens": 120, "completionTokens": None, "cost": None}},
        {"kind": "custom", "refId": "b", "name": "Flag", "weight": 0.0, "gate": False, "status": "scored",
         "native": True, "goodness": 1.0, "detail": None},
        {"kind": "pattern", "refId": "e", "name": "PII", "weight": 2.0, "gate": True, "status": "scored",
         "native": False, "goodness": 1.0, "detail": "template email did not match the output"}],
    "scoredAt": "2026-12-02T13:00:01.000005Z"}
# The same result at every other scope (and a backfill's trace): what differs from the trace's
# document, written out.
AT_SCOPE: dict[str, dict[str, object]] = {
    "trace": {},
    "session": {"id": SESSION_RATING_ID, "scope": "session", "traceId": None, "sessionId": "s-1", "turns": 3},
    "span": {"id": SPAN_RATING_ID, "scope": "span", "spanId": "t", "spanName": "lookup"},
    "playground": {"scope": "playground", "origin": None},  # an example is no traffic: no origin
    "dataset": {"id": DATASET_RATING_ID, "scope": "dataset", "runId": "run-1", "row": 4, "origin": None},
    "backfill": {"origin": "backfill"},  # a trace graded again: the same pair, so the same id
}


@pytest.mark.parametrize("case", sorted(AT_SCOPE))
def test_a_rating_is_exactly_this_document_at_each_scope(case: str) -> None:
    """Written out, not derived: a rating's id (its dedupe pair), subject and origin are checked
    against literals, so a slip in what ``build_rating`` and ``encode_rating`` share (the id,
    the subject key, the origin) cannot pass as both agreeing."""
    from scoring.results import encode_rating

    at = datetime(2026, 12, 2, 13, 0, 1, 5, tzinfo=UTC)
    outcomes = _sample_outcomes()
    step = Trace.model_validate({**TRACE.model_dump(by_alias=True), "spans": [
        {"spanId": "r", "name": "agent.run", "input": "q", "output": "a"},
        {"spanId": "t", "parentSpanId": "r", "name": "lookup", "kind": "tool", "output": "x"}]})
    scope = "trace" if case == "backfill" else case
    origin: RatingOrigin | None = "backfill" if case == "backfill" else None
    subject = {"session": _session_subject(), "span": span_subject(step, step.spans[1])}.get(scope, trace_subject(TRACE))
    result = GroupResult(GROUP, subject, blend([outcomes[0], outcomes[4], outcomes[5]]))  # type: ignore[arg-type]
    expected = {**TRACE_RATING, **AT_SCOPE[case]}
    dataset = ("run-1", 4) if scope == "dataset" else None
    built = orjson.loads(build_rating(result, scope, now=at, dataset=dataset,  # type: ignore[arg-type]
                                      origin=origin).to_json())
    assert built == expected and list(built) == list(expected)
    if scope != "dataset":  # the hot path encodes live and playground results only
        encoded = encode_rating(result, scope, now=at, origin=origin)  # type: ignore[arg-type]
        assert orjson.loads(encoded.document) == expected
        assert (encoded.id, encoded.trace_id, encoded.session_id, encoded.span_id, encoded.rating) == (
            expected["id"], expected["traceId"], expected["sessionId"], expected["spanId"], 9.0)


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
    """A backfill's history entry lands in the bucket of the trace's time (the chart
    fills in the past); a live one in the bucket of when it was scored."""
    from scoring.results import history_entry

    subject = trace_subject(TRACE)
    assert subject.at == TRACE.timestamp.timestamp()
    at = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    rating = build_rating(GroupResult(GROUP, subject, blend(_sample_outcomes()[:2])), "trace", now=at)  # type: ignore[arg-type]
    assert history_entry(GROUP, rating).at == at.timestamp()  # type: ignore[arg-type]
    assert history_entry(GROUP, rating, at=subject.at).at == TRACE.timestamp.timestamp()  # type: ignore[arg-type]
