"""The blend's words, exactly: the justification and every refusal read as the docs and the
spec show them. (Written against the survivors of mutation testing: a changed word, a dropped
member list or a lost gate name must fail a test.)"""

from __future__ import annotations

import pytest

from scoring.blend import REFERENCE_DELETED, MemberOutcome, blend, goodness


def m(name: str, weight: float, goodness: float | None, gate: bool = False, error: str | None = None) -> MemberOutcome:
    return MemberOutcome(name=name, kind="judge", weight=weight, gate=gate, goodness=goodness, error=error)


def test_a_blended_score_reads_its_parts_and_gates() -> None:
    r = blend([m("Help", 1.5, 0.8), m("Tone", 1, 0.6), m("PII", 0, 1.0, gate=True), m("Safe", 1, 0.9, gate=True)])
    assert r.justification == (
        "Weighted blend: 7.71/10, must-pass PII, Safe passed. Help 0.80 × w1.5 (43%); Tone 0.60 × w1 (29%); "
        "PII [must pass] 1.00 (gate only); Safe [must pass] 0.90 × w1 (29%)")
    assert [round(x.share, 4) for x in r.members] == [0.4286, 0.2857, 0.0, 0.2857]
    assert r.decided_by is None and r.reason is None


def test_a_score_without_gates_has_no_gate_note() -> None:
    assert blend([m("Help", 2, 0.5)]).justification == "Weighted blend: 5.00/10. Help 0.50 × w2 (100%)"


def test_a_failed_gate_names_itself_and_what_the_blend_alone_was() -> None:
    r = blend([m("Help", 1, 0.9), m("Safe", 1, 0.2, gate=True)])
    assert r.score == 0.0 and r.decided_by == "Safe" and len(r.members) == 2
    assert r.reason == 'Must-pass member "Safe" failed (goodness 0.20 < 0.5)'
    assert r.justification == ('Weighted blend: 0/10, must-pass member "Safe" failed (goodness 0.20 < 0.5), '
                               "the blend alone was 5.50. Help 0.90 × w1 (50%); Safe [must pass] 0.20 × w1 (50%)")
    gates_only = blend([m("Safe", 0, 0.2, gate=True)])
    assert gates_only.justification == ('Weighted blend: 0/10, must-pass member "Safe" failed (goodness 0.20 < 0.5). '
                                        "Safe [must pass] 0.20 (gate only)")


@pytest.mark.parametrize(("outcomes", "why", "decided_by", "parts"), [
    ([m("Help", 1, 0.9), m("PII", 0, None, gate=True, error=REFERENCE_DELETED)],
     'must-pass member "PII" could not score (reference deleted)', "PII",
     "Help 0.90 × w1 (100%); PII [must pass] could not score (reference deleted)"),
    ([m("PII", 0, 1.0, gate=True)], "every member has weight 0 (gates only)", None, "PII [must pass] 1.00 (gate only)"),
    ([m("Help", 1, None, error="judge down"), m("Old", 1, None, error=REFERENCE_DELETED)],
     "no member with a weight above 0 could score", None,
     "Help could not score (judge down); Old not scored (reference deleted)"),
])
def test_no_score_says_why_and_lists_every_member(outcomes: list[MemberOutcome], why: str,
                                                  decided_by: str | None, parts: str) -> None:
    r = blend(outcomes)
    assert r.score is None and r.reason == f"No score: {why}" and r.decided_by == decided_by
    assert r.justification == f"Weighted blend: no score, {why}. {parts}"
    assert len(r.members) == len(outcomes)


@pytest.mark.parametrize(("call", "says"), [
    (lambda: goodness("judge", float("inf")), "a judge rating must be a finite number, got inf"),
    (lambda: goodness("judge", float("-inf")), "a judge rating must be a finite number, got -inf"),
    (lambda: goodness("custom", float("inf")), "a custom score must be a finite number, got inf"),
    (lambda: goodness("judge", "8"), "a judge rating must be a number, got '8'"),
    (lambda: goodness("other", 1), "unknown member kind 'other'"),  # type: ignore[arg-type]
    (lambda: m("W", -1, 0.5), "a weight must be 0 or more, got -1"),
    (lambda: m("W", float("nan"), 0.5), "a weight must be a finite number, got nan"),
    (lambda: m("W", 1, 1.5), "goodness must be within 0-1, got 1.5"),
    (lambda: m("W", 1, float("inf")), "goodness must be a finite number, got inf"),
])
def test_refusals_say_exactly_what_is_wrong(call: object, says: str) -> None:
    with pytest.raises(ValueError) as info:
        call()  # type: ignore[operator]
    assert str(info.value) == says


def test_a_boolean_verdict_is_not_inverted_unless_asked() -> None:
    assert goodness("custom", True) == 1.0 and goodness("custom", False) == 0.0


def test_a_weight_that_rounds_to_a_whole_number_reads_whole() -> None:
    assert blend([m("Help", 2.001, 0.5)]).justification == "Weighted blend: 5.00/10. Help 0.50 × w2 (100%)"
