"""Calibration against people: how far a judge (or a group) agrees with the verdicts people gave the same rows.

Pure: a dataset run hands it pairs of (machine, human) verdicts. The one rule: each figure is the reference
library's definition (the tests hold them together), and None where the data cannot give one.
The figures and the suggested threshold: docs/design-notes.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Literal

from scorer_groups.agreement import (
    GATE_MARK,
    Agreement,
    AgreementColumn,
    AtMark,
    Disagreement,
    SuggestedThreshold,
)
from scorer_groups.agreement import Confusion as ConfusionWire
from scoring.frozen import frozen

Z95 = 1.959964  # the 97.5th percentile of the standard normal


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks; tied values share the average of the ranks they span."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        shared = (i + j) / 2 + 1
        for k in range(i, j + 1):
            out[order[k]] = shared
        i = j + 1
    return out


def pearson(x: Sequence[float], y: Sequence[float]) -> float | None:
    n = len(x)
    if n < 2:
        return None
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    if sxx == 0 or syy == 0:
        return None
    return max(-1.0, min(1.0, sxy / math.sqrt(sxx * syy)))


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    return pearson(ranks(x), ranks(y))


def mean_absolute_error(x: Sequence[float], y: Sequence[float]) -> float | None:
    return sum(abs(a - b) for a, b in zip(x, y, strict=True)) / len(x) if x else None


@frozen
class Confusion:
    """Pass/fail agreement: the machine's verdict against the people's."""

    both_pass: int
    machine_pass_people_fail: int
    machine_fail_people_pass: int
    both_fail: int

    @property
    def rows(self) -> int:
        return self.both_pass + self.machine_pass_people_fail + self.machine_fail_people_pass + self.both_fail


def confusion(machine: Sequence[bool], people: Sequence[bool]) -> Confusion:
    pairs = list(zip(machine, people, strict=True))
    return Confusion(sum(m and p for m, p in pairs), sum(m and not p for m, p in pairs),
                     sum(p and not m for m, p in pairs), sum(not m and not p for m, p in pairs))


def cohen_kappa(machine: Sequence[bool], people: Sequence[bool]) -> float | None:
    """Agreement beyond chance: (observed - expected) / (1 - expected)."""
    c = confusion(machine, people)
    n = c.rows
    if n == 0:
        return None
    observed = (c.both_pass + c.both_fail) / n
    machine_pass = (c.both_pass + c.machine_pass_people_fail) / n
    people_pass = (c.both_pass + c.machine_fail_people_pass) / n
    expected = machine_pass * people_pass + (1 - machine_pass) * (1 - people_pass)
    return None if expected == 1 else (observed - expected) / (1 - expected)


@frozen
class Suggestion:
    threshold: float  # pass at or above it
    balanced_accuracy: float
    low: float  # the 95% Wilson interval of the balanced accuracy
    high: float
    passes: int  # the people's pass rows behind it
    fails: int

    @property
    def sure(self) -> Literal["a hint", "fair", "firm"]:
        """How far to trust it, for a person: few rows of either class make it a hint."""
        fewest = min(self.passes, self.fails)
        return "a hint" if fewest < 10 else "fair" if fewest < 30 else "firm"


def wilson(successes: float, n: int) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def suggest_threshold(scores: Sequence[float], people_pass: Sequence[bool]) -> Suggestion | None:
    """The cut that separates the people's pass from their fail best (None without both)."""
    passes, fails = sum(people_pass), len(people_pass) - sum(people_pass)
    if not passes or not fails:
        return None
    distinct = sorted(set(scores))
    cuts = [distinct[0]] + [(a + b) / 2 for a, b in itertools.pairwise(distinct)] + [distinct[-1] + 1e-9]
    best: tuple[float, float] | None = None
    for cut in cuts:
        hit = sum(s >= cut and p for s, p in zip(scores, people_pass, strict=True))
        rejected = sum(s < cut and not p for s, p in zip(scores, people_pass, strict=True))
        balanced = (hit / passes + rejected / fails) / 2
        if best is None or balanced > best[1]:
            best = (cut, balanced)
    assert best is not None
    low, high = wilson(best[1] * len(scores), len(scores))
    return Suggestion(round(best[0], 3), best[1], low, high, passes, fails)


# --- A run's agreement ---------------------------------------------------------------------

MAX_DISAGREEMENTS = 5  # the rows a person reads first; the whole list is the run's rows


@frozen
class HumanVerdict:
    """What people said of a row: a 0-10 rating, a pass/fail, or both."""

    rating: float | None = None
    passed: bool | None = None

    def passes(self, mark: float) -> bool:
        """The people's pass at ``mark``: their own pass/fail when they gave one, else their rating."""
        if self.passed is not None:
            return self.passed
        assert self.rating is not None
        return self.rating >= mark


@frozen
class MachineColumn:
    kind: Literal["group", "judge"]
    label: str
    scorer_id: str | None
    values: Sequence[float | None]  # 0-10 per row, None where it gave no score


def agreement(humans: Sequence[HumanVerdict | None], columns: Sequence[MachineColumn], *,
              ids: Sequence[str | None], alert_threshold: float | None) -> Agreement | None:
    """The run's agreement with people (None when no row carries a human verdict). The first
    column is the group's."""
    labelled = [i for i, h in enumerate(humans) if h is not None]
    if not labelled or not columns:
        return None
    marks: list[tuple[Literal["gate", "alertThreshold"], float]] = [("gate", GATE_MARK)]
    if alert_threshold is not None:
        marks.append(("alertThreshold", alert_threshold))
    group, *judges = [_column(c, humans, labelled, ids, marks) for c in columns]
    rated = sum(1 for h in humans if h is not None and h.rating is not None)
    return Agreement(labelled_rows=len(labelled), human_ratings=rated, group=group, judges=judges)


def _column(column: MachineColumn, humans: Sequence[HumanVerdict | None], labelled: list[int],
            ids: Sequence[str | None], marks: list[tuple[Literal["gate", "alertThreshold"], float]]) -> AgreementColumn:
    pairs = [(i, v, h) for i in labelled if (v := column.values[i]) is not None and (h := humans[i]) is not None]
    rated = [(v, h.rating) for _, v, h in pairs if h.rating is not None]
    machine_rated, human_rated = [v for v, _ in rated], [r for _, r in rated]
    at_marks = []
    for name, mark in marks:
        machine, people = [v >= mark for _, v, _ in pairs], [h.passes(mark) for _, _, h in pairs]
        c = confusion(machine, people)
        at_marks.append(AtMark(mark=name, threshold=mark, rows=c.rows, kappa=_round(cohen_kappa(machine, people)),
                               confusion=ConfusionWire(both_pass=c.both_pass,
                                                       machine_pass_people_fail=c.machine_pass_people_fail,
                                                       machine_fail_people_pass=c.machine_fail_people_pass,
                                                       both_fail=c.both_fail)))
    reference = marks[-1][1]  # the group's alertThreshold when it has one: the line people act on
    suggestion = suggest_threshold([v for _, v, _ in pairs], [h.passes(reference) for _, _, h in pairs])
    return AgreementColumn(
        kind=column.kind, label=column.label, scorer_id=column.scorer_id, labelled_rows=len(pairs),
        unscored_labelled_rows=len(labelled) - len(pairs),
        spearman=_round(spearman(machine_rated, human_rated)),
        mean_absolute_error=_round(mean_absolute_error(machine_rated, human_rated)),
        marks=at_marks,
        suggested_threshold=None if suggestion is None else SuggestedThreshold(
            threshold=suggestion.threshold, balanced_accuracy=round(suggestion.balanced_accuracy, 4),
            low=round(suggestion.low, 4), high=round(suggestion.high, 4), passes=suggestion.passes,
            fails=suggestion.fails, sure=suggestion.sure),
        disagreements=_disagreements(pairs, ids))


def _disagreements(pairs: list[tuple[int, float, HumanVerdict]], ids: Sequence[str | None]) -> list[Disagreement]:
    """The rows where machine and people are furthest apart: by the rating's distance, or for a
    pass/fail alone, by how far past the gate mark the machine erred."""
    found = []
    for row, machine, human in pairs:
        if human.rating is not None:
            gap = abs(machine - human.rating)
        else:
            gap = abs(machine - GATE_MARK) if (machine >= GATE_MARK) != human.passes(GATE_MARK) else 0.0
        if gap > 0:
            found.append(Disagreement(row=row, id=ids[row], machine=machine, human_rating=human.rating,
                                      human_pass=human.passed, gap=round(gap, 4)))
    found.sort(key=lambda d: (-d.gap, d.row))
    return found[:MAX_DISAGREEMENTS]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
