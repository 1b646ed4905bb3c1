"""Alignment runs: does a candidate judge agree with people better than the current one, on labels it never saw?

Pure: the API reads the labels and grades (``worker.api.alignments``). The one rule: a case the
candidate shows as an example is never graded by it, and the same labels split the same way every time.
The steps: docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from scorer_groups.alignments import ChangedVerdict, Figure, JudgeFigures
from scoring.calibration import cohen_kappa, mean_absolute_error, spearman
from scoring.frozen import frozen
from scoring.models import JudgeExample

TUNE_SHARE = 0.3
MARK = 5.0
RESAMPLES = 400
SEED = 56
MAX_EVALUATED = 1_000  # held-out cases graded by each judge: a bound on a run's judge calls
CHANGED_SHOWN = 50
CHANGED_BY = 2.0  # points a verdict must move (or cross the mark) to count as changed
# Held-out cases both judges must have graded for a promotion without ``force``: on fewer, "at
# least as good" is a coin's word (one case with equal errors promoted a candidate).
PROMOTE_MIN_CASES = 10


@frozen
class Case:
    id: str  # a review item's id, or "<dataset>:<version>:<row>"
    input: str
    output: str
    human: float


def _tune(case_id: str) -> bool:
    digest = hashlib.sha256(f"alignment:{case_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < TUNE_SHARE


def split(cases: Sequence[Case], examples: Sequence[JudgeExample]) -> tuple[list[Case], list[Case], list[Case]]:
    """2 and 3: (the candidate's own examples, the tune cases, the held-out cases - at most
    ``MAX_EVALUATED``, in the cases' order)."""
    sources = {e.source for e in examples if e.source}
    outputs = {e.output.strip() for e in examples if e.output.strip()}
    own = [c for c in cases if c.id in sources or c.output.strip() in outputs]
    rest = [c for c in cases if c not in own]
    return own, [c for c in rest if _tune(c.id)], [c for c in rest if not _tune(c.id)][:MAX_EVALUATED]


def _figures(pairs: Sequence[tuple[float, float]]) -> tuple[float | None, float | None, float | None]:
    machine, people = [m for m, _ in pairs], [p for _, p in pairs]
    return (spearman(machine, people) if len(pairs) >= 2 else None,
            cohen_kappa([m >= MARK for m in machine], [p >= MARK for p in people]) if pairs else None,
            mean_absolute_error(machine, people) if pairs else None)


def judge_figures(scores: Sequence[float | None], humans: Sequence[float]) -> JudgeFigures:
    """4: one judge's figures over the cases it scored (``scores[i]`` None: it could not)."""
    pairs = [(s, h) for s, h in zip(scores, humans, strict=True) if s is not None]
    point = _figures(pairs)
    rng = random.Random(SEED)
    draws: list[list[float]] = [[], [], []]
    for _ in range(RESAMPLES if len(pairs) >= 2 else 0):
        for k, value in enumerate(_figures([pairs[rng.randrange(len(pairs))] for _ in pairs])):
            if value is not None:
                draws[k].append(value)

    def figure(k: int) -> Figure | None:
        value = point[k]
        if value is None:
            return None
        ordered = sorted(draws[k]) or [value]
        low, high = ordered[int(0.025 * (len(ordered) - 1))], ordered[int(0.975 * (len(ordered) - 1))]
        return Figure(value=round(value, 4), low=round(low, 4), high=round(high, 4))

    return JudgeFigures(cases=len(pairs), spearman=figure(0), kappa=figure(1), mean_absolute_error=figure(2))


def better(current: JudgeFigures, candidate: JudgeFigures) -> bool:
    """5: the candidate agrees at least as well."""
    if current.spearman is not None and candidate.spearman is not None \
            and abs(candidate.spearman.value - current.spearman.value) > 1e-9:
        return candidate.spearman.value > current.spearman.value
    if current.mean_absolute_error is not None and candidate.mean_absolute_error is not None:
        return candidate.mean_absolute_error.value <= current.mean_absolute_error.value
    return candidate.cases > 0 and current.cases == 0


def changed(cases: Sequence[Case], current: Sequence[float | None],
            candidate: Sequence[float | None]) -> list[ChangedVerdict]:
    """5: the cases the candidate grades otherwise, the largest moves first."""
    moved = []
    for case, old, new in zip(cases, current, candidate, strict=True):
        if old is None or new is None:
            if old != new:
                moved.append((10.0, case, old, new))
            continue
        if abs(new - old) >= CHANGED_BY or (old >= MARK) != (new >= MARK):
            moved.append((abs(new - old), case, old, new))
    moved.sort(key=lambda m: -m[0])
    return [ChangedVerdict(case_id=c.id, input=c.input[:300], human=c.human, current=old, candidate=new)
            for _, c, old, new in moved[:CHANGED_SHOWN]]
