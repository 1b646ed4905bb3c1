"""THE score: blend what each member of a group said into one 0-10 rating.

1. Every member's native verdict is normalized to a 0-1 goodness (``goodness``).
2. Must-pass gates are read first: a gate whose goodness is below 0.5 zeroes the group; a gate
   that could not score leaves the group with no score (fail closed), unless another gate has
   failed outright - a known failure is never hidden behind "no score".
3. Otherwise the score is the weighted average of goodness over the members that produced one
   (renormalization), times 10. With no weight left, there is no score.

Pure code: no I/O, no clock, no randomness.
"""

from __future__ import annotations

import math

from scorer_groups.documents import MemberStatus
from scoring.frozen import frozen
from scoring.models import MemberKind, Polarity
from scoring.ports import JudgeCall, TokenUsage

GATE_PASS_MARK = 0.5  # goodness below this fails a must-pass member; exactly 0.5 passes
REFERENCE_DELETED = "reference deleted"
# Scores are rounded so 10 * 2.6 / 4 reads 6.5, not 6.499999999999999. Rounding is monotone,
# so it never reverses an order between two scores.
SCORE_DECIMALS = 6


def _finite_number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number, got {value!r}")
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"{what} must be a finite number, got {value!r}")
    return number


def goodness(
    kind: MemberKind,
    native: object,  # checked here, in words: typed narrower, a compiled build would refuse it first
    *,
    polarity: Polarity | None = None,
    invert: bool = False,
) -> float:
    """Normalize a member's native verdict to 0-1.

    judge: rating 0-10 → rating / 10.  pattern: matched? through polarity (a matched failure
    pattern is 0, a matched proper pattern is 1).  custom: a 0..1 score as-is, or a boolean
    verdict as 1/0 flipped by ``invert``. A value off its scale raises ValueError; it is never
    clamped, because a clamped wrong value would be scored as if it were right.
    """
    if kind == "judge":
        rating = _finite_number(native, "a judge rating")
        if not 0 <= rating <= 10:
            raise ValueError(f"a judge rating must be within 0-10, got {native!r}")
        return rating / 10
    if kind == "pattern":
        if not isinstance(native, bool):
            raise ValueError(f"a pattern verdict must be matched (true) or not (false), got {native!r}")
        if polarity == "failure":
            return 0.0 if native else 1.0
        if polarity == "proper":
            return 1.0 if native else 0.0
        raise ValueError(f"a pattern needs polarity 'failure' or 'proper', got {polarity!r}")
    if kind == "custom":
        if isinstance(native, bool):
            return float(native != invert)
        score = _finite_number(native, "a custom score")
        if not 0 <= score <= 1:
            raise ValueError(f"a custom score must be within 0..1, got {native!r}")
        return score
    raise ValueError(f"unknown member kind {kind!r}")


@frozen
class MemberOutcome:
    """What one member said about one subject: a goodness, or why there is none."""

    name: str
    kind: MemberKind
    weight: float
    gate: bool
    goodness: float | None = None
    error: str | None = None
    ref_id: str = ""
    native: float | bool | None = None
    detail: str | None = None
    scorer_name: str = ""  # the scorer's own name now ("" when unknown); ``name`` is the member's label
    usage: TokenUsage | None = None  # a judge's tokens, when its API reported them
    skipped: str | None = None  # why the member was not called (gates first), when it was not
    calls: tuple[JudgeCall, ...] = ()  # a judge's calls, cut and masked (scoring.judge_calls)
    cached_from: str | None = None  # a judge's verdict paid for already, by this rating (scoring.verdict_cache)

    def __post_init__(self) -> None:
        # A float in range passes at once (NaN fails every comparison): the common case, per member.
        weight, g = self.weight, self.goodness
        if type(weight) is not float or not 0.0 <= weight < math.inf:
            if _finite_number(weight, "a weight") < 0:
                raise ValueError(f"a weight must be 0 or more, got {weight:g}")
        if g is not None and (type(g) is not float or not 0.0 <= g <= 1.0):
            if not 0 <= _finite_number(g, "goodness") <= 1:
                raise ValueError(f"goodness must be within 0-1, got {g:g}")

    @property
    def status(self) -> MemberStatus:
        if self.goodness is not None:
            return "scored"
        if self.skipped is not None:
            return "skipped"
        # A deleted non-gating member degrades quietly; a deleted gate fails (closed).
        if self.error == REFERENCE_DELETED and not self.gate:
            return "not_scored"
        return "failed"

    @property
    def why_unscored(self) -> str:
        return self.error or self.skipped or "no verdict"


@frozen
class MemberResult:
    """A member as it appears on a group result: its outcome, status and share of the blend."""

    outcome: MemberOutcome
    status: MemberStatus
    share: float  # fraction of the blend's weight this member carried (0 when not counted)


@frozen
class BlendResult:
    score: float | None
    reason: str | None
    justification: str
    members: tuple[MemberResult, ...]
    decided_by: str | None = None  # the gate that decided the score, if one did

    @property
    def scored(self) -> bool:
        return self.score is not None


def _num(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))


def _member_part(o: MemberOutcome, status: MemberStatus, share: float) -> str:
    gate = " [must pass]" if o.gate else ""
    if o.goodness is None:
        label = {"not_scored": "not scored", "skipped": "skipped"}.get(status, "could not score")
        return f"{o.name}{gate} {label} ({o.why_unscored})"
    if o.weight == 0:
        return f"{o.name}{gate} {o.goodness:.2f} (gate only)"
    return f"{o.name}{gate} {o.goodness:.2f} × w{_num(o.weight)} ({share:.0%})"


def blend(outcomes: list[MemberOutcome] | tuple[MemberOutcome, ...]) -> BlendResult:
    """The group score from its members' outcomes (see the module docstring for the rules)."""
    # One pass over the members for what the rules read: the weight that counts, the first gate
    # that failed and the first that could not score. (Once per result: kept to plain loops.)
    counted: list[MemberOutcome] = []  # scored, with a weight above 0: they carry the average
    failed_gate: MemberOutcome | None = None
    unscored_gate: MemberOutcome | None = None
    for o in outcomes:
        if o.goodness is None:
            if o.gate and unscored_gate is None:
                unscored_gate = o
            continue
        if o.weight > 0:
            counted.append(o)
        if o.gate and failed_gate is None and o.goodness < GATE_PASS_MARK:
            failed_gate = o
    total_weight = math.fsum(o.weight for o in counted)
    members = tuple(MemberResult(o, o.status, o.weight / total_weight if o.goodness is not None and o.weight > 0
                                 else 0.0) for o in outcomes)
    parts = "; ".join([_member_part(m.outcome, m.status, m.share) for m in members])

    average: float | None = None
    if total_weight > 0:
        # fsum is exactly rounded, so the score does not depend on the members' order.
        weighted = math.fsum(o.weight * o.goodness for o in counted if o.goodness is not None)
        average = 10 * weighted / total_weight

    if failed_gate is not None:
        why = (f'must-pass member "{failed_gate.name}" failed '
               f"(goodness {failed_gate.goodness:.2f} < {GATE_PASS_MARK})")
        alone = f", the blend alone was {average:.2f}" if average is not None else ""
        return BlendResult(0.0, why[0].upper() + why[1:],
                           f"Weighted blend: 0/10, {why}{alone}. {parts}",
                           members, decided_by=failed_gate.name)

    if unscored_gate is not None:
        why = f'must-pass member "{unscored_gate.name}" could not score ({unscored_gate.why_unscored})'
        return _no_score(why, parts, members, decided_by=unscored_gate.name)

    if average is None:
        if all(o.weight == 0 for o in outcomes):
            return _no_score("every member has weight 0 (gates only)", parts, members)
        return _no_score("no member with a weight above 0 could score", parts, members)

    score = round(average, SCORE_DECIMALS)
    gates = [o.name for o in outcomes if o.gate]
    gate_note = f", must-pass {', '.join(gates)} passed" if gates else ""
    return BlendResult(score, None, f"Weighted blend: {score:.2f}/10{gate_note}. {parts}", members)


def _no_score(why: str, parts: str, members: tuple[MemberResult, ...],
              decided_by: str | None = None) -> BlendResult:
    return BlendResult(None, f"No score: {why}", f"Weighted blend: no score, {why}. {parts}",
                       members, decided_by=decided_by)
