"""CI gates over a run's columns - the group score of each row (or why it has none) and each
judge member's verdicts - whether the run was graded here or fetched from the API: the SDK's
``run.gate`` and ``scorer-worker grade --fail-under`` read the same rules. Pure: no I/O.

Its errors are the SDK's, not the server's ``ScoringError`` family: a gate's verdict is for
the caller (a CI job) to act on, and never an HTTP answer."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

Allowance = int | float  # rows without a score a gate lets pass: a count, or a fraction of the rows


def parse_allowance(text: str) -> Allowance:
    """``--allow-unscored``: a count ("3") or a fraction of the rows ("0.1")."""
    try:
        value: Allowance = int(text) if text.strip().isdigit() else float(text)
    except ValueError:
        raise ValueError(f"--allow-unscored: {text!r} is neither a row count nor a fraction") from None
    if isinstance(value, float) and not 0 <= value <= 1:
        raise ValueError(f"--allow-unscored: a fraction is between 0 and 1 (got {text})")
    if value < 0:
        raise ValueError(f"--allow-unscored: cannot be negative (got {text})")
    return value


class GateFailed(Exception):
    """A CI gate did not pass; the message says which and by how much. ``shortfall`` is how far
    the score is under ``fail_under`` (None when the score passed or there is none), and
    ``unscored`` / ``allowed`` count the rows without a score and how many the gate let pass."""

    def __init__(self, message: str, *, value: float | None = None, fail_under: float | None = None,
                 unscored: int = 0, allowed: int = 0) -> None:
        super().__init__(message)
        self.value, self.fail_under, self.unscored, self.allowed = value, fail_under, unscored, allowed
        self.shortfall = (fail_under - value if value is not None and fail_under is not None
                          and value < fail_under else None)


class NotAJudgeMember(ValueError):
    """A gate names no judge member of the run (a pattern, a typo), or several: a mistake in the
    gate's configuration, not a quality failure - the message lists the judge members there are."""


@dataclass(frozen=True)
class JudgeColumn:
    """One judge member over a run's rows: its label, and its rating (or error) on each row."""

    label: str
    ref_id: str
    name: str
    ratings: list[float | None]
    errors: list[str | None]

    @property
    def average(self) -> float | None:
        scored = [r for r in self.ratings if r is not None]
        return math.fsum(scored) / len(scored) if scored else None


def breakdown_lines(name: str, by_group: bool, rating: float | None, scored: int, rows: int,
                    judges: list[tuple[str, float | None]]) -> list[str]:
    """A run's breakdown: led by "<Name> (group)" on a group-graded run; on a single-scorer run
    by the scorer's name alone (no group graded it), whose own line is then not repeated."""
    def show(v: float | None) -> str:
        return "no score" if v is None else f"{v:.2f}"

    lines = [f"{name}{' (group)' if by_group else ''}: {show(rating)} ({scored} of {rows} rows scored)"]
    lines += [f"{label}: {show(average)}" for label, average in judges if by_group or label != name]
    return lines


@dataclass(frozen=True)
class GateColumns:
    """What a CI gate reads of a run, whether graded here or fetched from the API: the group
    score (or why there is none) of each row, and each judge member's column. ``name`` is the
    group's, or on a single-scorer run (``by_group`` False) the scorer's."""

    name: str
    ratings: list[float | None]
    reasons: list[str | None]
    judges: list[JudgeColumn]
    by_group: bool = True

    @property
    def graded_by(self) -> str:
        return f"{'group' if self.by_group else 'scorer'} {self.name!r}"

    @property
    def rating(self) -> float | None:
        scored = [r for r in self.ratings if r is not None]
        return math.fsum(scored) / len(scored) if scored else None

    def judge(self, name: str) -> JudgeColumn:
        """The judge member a named gate means: its label, else its scorer's name or id. A name
        that fits several members is refused, never guessed."""
        found = [j for j in self.judges if j.label == name] or \
            [j for j in self.judges if name in (j.ref_id, j.name)]
        if len(found) == 1:
            return found[0]
        known = ", ".join(repr(j.label) for j in self.judges) or "none"
        if not found:
            raise NotAJudgeMember(f"no judge member named {name!r} in {self.graded_by} "
                                  f"(judge members: {known})")
        raise NotAJudgeMember(f"judge name {name!r} is ambiguous in {self.graded_by}: it names "
                         f"{len(found)} members ({', '.join(repr(j.label) for j in found)}); "
                         "gate on one of their labels")

    def gate(self, fail_under: float, scorer: str | None = None, allow_unscored: Allowance = 0) -> float:
        """Pass when the group score (or the named judge member's own average) is at least
        ``fail_under`` and no row lacks that score; raise GateFailed saying which and by how
        much otherwise. Fail closed: a row where a must-pass member could not score has no group
        score, and fails the gate unless ``allow_unscored`` (a count, or a fraction of the rows)
        lets it pass explicitly."""
        if scorer is None:
            value, what = self.rating, self.graded_by
            why = [reason or "no score" for rating, reason in zip(self.ratings, self.reasons, strict=True)
                   if rating is None]
        else:
            judge = self.judge(scorer)
            value, what = judge.average, f"judge {judge.label!r}"
            why = [error or "no verdict" for rating, error in zip(judge.ratings, judge.errors, strict=True)
                   if rating is None]
        total = len(self.ratings)
        allowed = allow_unscored if isinstance(allow_unscored, int) else math.floor(allow_unscored * total + 1e-9)
        problems = []
        if len(why) > allowed:
            reasons = Counter(why).most_common()
            problems.append(f"{len(why)} of {total} rows have no {what} score and {allowed} may "
                            "(allow_unscored / --allow-unscored): "
                            + "; ".join(f"{n} row{'s' if n > 1 else ''}: {reason}" for reason, n in reasons))
        noun = "score" if scorer is None else "average"
        if value is None:
            problems.append(f"{what} {noun} has no score on any row (needs >= {fail_under:g})")
        elif value < fail_under:
            problems.append(f"{what} {noun} is {value:.2f}, under {fail_under:g} by {fail_under - value:.2f}")
        if problems:
            raise GateFailed("gate failed: " + "; and ".join(problems), value=value, fail_under=fail_under,
                             unscored=len(why), allowed=allowed)
        assert value is not None
        return value
