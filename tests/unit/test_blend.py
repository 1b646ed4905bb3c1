"""The blend, sentence by sentence from the spec's "How the score is computed" and the design's
readings of what the spec leaves open."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from scoring.blend import REFERENCE_DELETED, MemberOutcome, blend, goodness


def m(name: str, g: float | None, weight: float = 1, gate: bool = False, kind: str = "judge",
      error: str | None = None) -> MemberOutcome:
    return MemberOutcome(name=name, kind=kind, weight=weight, gate=gate, goodness=g,  # type: ignore[arg-type]
                         error=error if g is None else None)


# --- Normalization per kind ---------------------------------------------------------------

@pytest.mark.parametrize(("rating", "expected"), [(0, 0.0), (8, 0.8), (10, 1.0), (7.5, 0.75)])
def test_judge_rating_is_divided_by_ten(rating: float, expected: float) -> None:
    assert goodness("judge", rating) == pytest.approx(expected)


@pytest.mark.parametrize("rating", [-0.1, 10.01, 11, math.nan, math.inf, True, "8"])
def test_judge_rating_off_its_scale_is_an_error_never_clamped(rating: object) -> None:
    with pytest.raises(ValueError, match="judge rating"):
        goodness("judge", rating)  # type: ignore[arg-type]


@pytest.mark.parametrize(("matched", "polarity", "expected"), [
    (True, "failure", 0.0),   # a matched failure pattern is 0
    (False, "failure", 1.0),  # clean is 1
    (True, "proper", 1.0),    # a matched proper pattern ("contains disclaimer") is 1
    (False, "proper", 0.0),
])
def test_pattern_is_polarity_mapped(matched: bool, polarity: str, expected: float) -> None:
    assert goodness("pattern", matched, polarity=polarity) == expected  # type: ignore[arg-type]


def test_pattern_needs_a_boolean_and_a_polarity() -> None:
    with pytest.raises(ValueError, match="matched"):
        goodness("pattern", 1, polarity="failure")
    with pytest.raises(ValueError, match="polarity"):
        goodness("pattern", True)


@pytest.mark.parametrize("score", [0, 0.0, 0.7, 1])
def test_code_and_external_scores_pass_as_is(score: float) -> None:
    assert goodness("custom", score) == score


@pytest.mark.parametrize("score", [1.5, -0.01, math.nan, math.inf])
def test_custom_score_off_0_1_is_an_error(score: float) -> None:
    with pytest.raises(ValueError, match="custom score"):
        goodness("custom", score)


@pytest.mark.parametrize(("verdict", "invert", "expected"), [
    (True, False, 1.0), (False, False, 0.0), (True, True, 0.0), (False, True, 1.0)])
def test_external_boolean_maps_through_invert(verdict: bool, invert: bool, expected: float) -> None:
    assert goodness("custom", verdict, invert=invert) == expected


def test_invert_does_not_touch_a_numeric_score() -> None:
    assert goodness("custom", 0.7, invert=True) == 0.7


def test_outcome_refuses_goodness_off_0_1_and_negative_weight() -> None:
    with pytest.raises(ValueError):
        m("A", 1.2)
    with pytest.raises(ValueError):
        m("A", 0.5, weight=-1)
    with pytest.raises(ValueError):
        m("A", math.nan)


# --- The weighted average -------------------------------------------------------------------

def test_score_is_weighted_average_of_goodness_on_0_10() -> None:
    r = blend([m("Quality", 0.8, weight=1), m("Tone", 0.6, weight=3)])
    assert r.score == pytest.approx(10 * (0.8 * 1 + 0.6 * 3) / 4)
    assert r.reason is None
    assert [mr.share for mr in r.members] == [0.25, 0.75]


def test_renormalization_over_members_that_produced_a_score() -> None:
    # A judge outage shrinks the denominator instead of dragging the score down.
    r = blend([m("Quality", 0.8, weight=1), m("Tone", None, weight=3, error="judge timeout")])
    assert r.score == pytest.approx(8.0)
    tone = r.members[1]
    assert tone.status == "failed" and tone.outcome.error == "judge timeout", "still reported"
    assert "Tone could not score (judge timeout)" in r.justification


def test_deleted_non_gating_member_is_not_scored_and_left_out() -> None:
    r = blend([m("Quality", 0.9, weight=2), m("Old", None, weight=5, error=REFERENCE_DELETED)])
    assert r.score == pytest.approx(9.0)
    assert r.members[1].status == "not_scored"
    assert "Old not scored (reference deleted)" in r.justification


def test_deleted_gating_member_fails_closed() -> None:
    r = blend([m("Quality", 0.9), m("PII", None, weight=0, gate=True, kind="pattern",
                                      error=REFERENCE_DELETED)])
    assert r.score is None
    assert r.reason == 'No score: must-pass member "PII" could not score (reference deleted)'
    assert r.members[1].status == "failed"


def test_all_weights_zero_gives_no_score() -> None:
    r = blend([m("A", 0.9, weight=0), m("B", 0.2, weight=0)])
    assert r.score is None
    assert r.reason == "No score: every member has weight 0 (gates only)"


def test_all_weights_zero_gates_still_apply_a_failed_gate_gives_zero() -> None:
    r = blend([m("A", 0.9, weight=0), m("Apology", 0.0, weight=0, gate=True, kind="pattern")])
    assert r.score == 0.0
    assert r.decided_by == "Apology"


def test_all_weights_zero_with_passing_gates_gives_no_score() -> None:
    r = blend([m("Apology", 1.0, weight=0, gate=True, kind="pattern")])
    assert r.score is None and r.reason is not None and r.reason.startswith("No score")


def test_every_weighted_member_unscored_gives_no_score() -> None:
    r = blend([m("A", None, error="timeout"), m("B", None, error="HTTP 500"),
               m("Gate", 1.0, weight=0, gate=True)])
    assert r.score is None
    assert r.reason == "No score: no member with a weight above 0 could score"


@pytest.mark.parametrize("weight", [0, 1000])
def test_weight_boundaries(weight: float) -> None:
    r = blend([m("A", 1.0, weight=weight), m("B", 0.0, weight=1)])
    expected = 10 * weight / (weight + 1)
    assert r.score == pytest.approx(expected)


# --- Must-pass gates ------------------------------------------------------------------------

@pytest.mark.parametrize("gate_goodness", [0.0, 0.4, 0.49, 0.4999999])
def test_gate_below_half_zeroes_the_group(gate_goodness: float) -> None:
    r = blend([m("Quality", 1.0, weight=10), m("Safety", gate_goodness, gate=True)])
    assert r.score == 0.0
    assert r.reason == f'Must-pass member "Safety" failed (goodness {gate_goodness:.2f} < 0.5)'
    assert r.decided_by == "Safety"


def test_gate_at_exactly_half_passes() -> None:
    r = blend([m("Quality", 1.0, weight=1), m("Safety", 0.5, weight=1, gate=True)])
    assert r.score == pytest.approx(7.5)
    assert r.reason is None


@pytest.mark.parametrize(("member", "native", "extra"), [
    ("pattern", True, {"polarity": "failure"}),  # a matched failure pattern
    ("judge", 4.9, {}),                          # a judge under 5/10
    ("custom", 0.49, {}),                        # a code score under 0.5
])
def test_the_spec_examples_of_failing_gates(member: str, native: object, extra: dict) -> None:
    g = goodness(member, native, **extra)  # type: ignore[arg-type]
    r = blend([m("Quality", 1.0), m("Gate", g, weight=0, gate=True, kind=member)])
    assert r.score == 0.0


def test_failed_gate_beats_an_unscorable_gate() -> None:
    # A known failure is never reported as "no score".
    r = blend([m("Quality", 0.9), m("Judge gate", None, gate=True, error="judge outage"),
               m("PII", 0.0, weight=0, gate=True, kind="pattern")])
    assert r.score == 0.0
    assert r.decided_by == "PII"


# --- Fail-closed gates ----------------------------------------------------------------------

@pytest.mark.parametrize("why", ["judge outage", REFERENCE_DELETED, "ZeroDivisionError: division by zero"])
def test_unscorable_gate_gives_no_score_with_the_exact_reason(why: str) -> None:
    r = blend([m("Quality", 1.0, weight=5), m("Safety", None, gate=True, error=why)])
    assert r.score is None
    assert r.reason == f'No score: must-pass member "Safety" could not score ({why})'


# --- The justification ----------------------------------------------------------------------

def test_justification_reads_in_one_line_with_each_members_part() -> None:
    r = blend([m("Quality", 0.8, weight=1), m("Tone", 0.6, weight=3),
               m("PII", 1.0, weight=0, gate=True, kind="pattern")])
    j = r.justification
    assert j.startswith("Weighted blend: 6.50/10")
    assert "\n" not in j
    assert "Quality 0.80 × w1 (25%)" in j
    assert "Tone 0.60 × w3 (75%)" in j
    assert "PII [must pass] 1.00 (gate only)" in j
    assert "must-pass PII passed" in j


def test_justification_names_the_gate_that_decided() -> None:
    r = blend([m("Quality", 0.9, weight=1), m("Safety", 0.3, gate=True)])
    assert r.justification.startswith('Weighted blend: 0/10, must-pass member "Safety" failed')
    assert "the blend alone was 6.00" in r.justification


# --- Properties -----------------------------------------------------------------------------

weights = st.one_of(st.just(0.0), st.floats(min_value=0.001, max_value=1000, allow_nan=False))
goodnesses = st.one_of(st.none(), st.floats(min_value=0, max_value=1, allow_nan=False))
members = st.lists(st.tuples(goodnesses, weights, st.booleans()), min_size=1, max_size=20)


def build(spec: list[tuple[float | None, float, bool]]) -> list[MemberOutcome]:
    return [m(f"M{i}", g, weight=w, gate=gate, error="failed" if g is None else None)
            for i, (g, w, gate) in enumerate(spec)]


@given(members)
def test_score_is_within_0_10_or_none(spec: list[tuple[float | None, float, bool]]) -> None:
    r = blend(build(spec))
    assert r.score is None or 0 <= r.score <= 10


@given(members, st.data())
def test_score_never_rises_when_a_members_goodness_falls(spec, data) -> None:  # type: ignore[no-untyped-def]
    scored = [i for i, (g, _, _) in enumerate(spec) if g is not None]
    assume(scored)
    i = data.draw(st.sampled_from(scored))
    g, w, gate = spec[i]
    lower = data.draw(st.floats(min_value=0, max_value=g))
    before = blend(build(spec)).score
    after = blend(build([*spec[:i], (lower, w, gate), *spec[i + 1:]])).score
    if before is not None and after is not None:
        assert after <= before
    else:
        assert (before is None and after is None) or after == 0.0


@given(members, st.randoms())
def test_score_is_invariant_to_member_order(spec, rnd) -> None:  # type: ignore[no-untyped-def]
    outcomes = build(spec)
    shuffled = list(outcomes)
    rnd.shuffle(shuffled)
    assert blend(outcomes).score == blend(shuffled).score


@given(members, st.floats(min_value=0.01, max_value=100))
def test_score_is_invariant_to_scaling_all_weights(spec, factor) -> None:  # type: ignore[no-untyped-def]
    assume(all(w * factor <= 1000 for _, w, _ in spec))
    a = blend(build(spec)).score
    b = blend(build([(g, w * factor, gate) for g, w, gate in spec])).score
    assert (a is None) == (b is None)
    if a is not None and b is not None:
        assert b == pytest.approx(a, abs=1e-5)


@given(members, st.floats(min_value=0, max_value=0.4999))
def test_a_failed_gate_always_gives_zero(spec, low) -> None:  # type: ignore[no-untyped-def]
    r = blend([*build(spec), m("Failing gate", low, weight=1, gate=True)])
    assert r.score == 0.0


def test_judges_skipped_behind_a_failed_free_gate_read_as_skipped_and_the_gate_decides() -> None:
    why = 'not called: must-pass member "PII" failed first (gatesFirst)'
    outcomes = [MemberOutcome(name="PII", kind="pattern", weight=0, gate=True, native=True, goodness=0.0),
                MemberOutcome(name="Quality", kind="judge", weight=2, gate=False, skipped=why),
                MemberOutcome(name="Safety", kind="judge", weight=1, gate=True, skipped=why)]
    result = blend(outcomes)
    assert result.score == 0.0 and result.decided_by == "PII"
    assert [m.status for m in result.members] == ["scored", "skipped", "skipped"]
    assert [m.share for m in result.members] == [0.0, 0.0, 0.0]
    assert f"Quality skipped ({why})" in result.justification
    assert f"Safety [must pass] skipped ({why})" in result.justification
    assert outcomes[1].why_unscored == why
