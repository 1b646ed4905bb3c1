"""Calibration figures held to the reference libraries' on random data - Spearman's
rank correlation (scipy), Cohen's kappa and mean absolute error (scikit-learn) - and on their
documented examples; the suggested threshold separates the people's pass from fail, and says
how sure it is."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from scoring.calibration import (
    cohen_kappa,
    confusion,
    mean_absolute_error,
    ranks,
    spearman,
    suggest_threshold,
)

stats = pytest.importorskip("scipy.stats")
metrics = pytest.importorskip("sklearn.metrics")


def reference(figure: Callable[..., Any], *args: Any) -> Any:
    """A reference library's figure; its warnings about data it cannot judge (one class, no
    spread) are its way of saying NaN, which the comparison checks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return figure(*args)


def same(ours: float | None, theirs: float) -> bool:
    return ours is None if math.isnan(theirs) else ours is not None and math.isclose(ours, theirs, abs_tol=1e-9)


@pytest.mark.parametrize("seed", range(40))
def test_spearman_mae_and_kappa_match_the_reference_libraries_on_random_data(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(2, 60)
    # Judges answer whole numbers often: ties are the common case, not the corner.
    machine = [float(rng.choice(range(11))) if rng.random() < 0.7 else rng.uniform(0, 10) for _ in range(n)]
    people = [min(10.0, max(0.0, m + rng.gauss(0, 2))) if rng.random() < 0.8 else float(rng.randint(0, 10))
              for m in machine]
    assert same(spearman(machine, people), reference(stats.spearmanr, machine, people).statistic)
    assert math.isclose(mean_absolute_error(machine, people) or 0.0, metrics.mean_absolute_error(people, machine))
    mark = rng.choice([5.0, 6.0, 7.0])
    machine_pass, people_pass = [m >= mark for m in machine], [p >= mark for p in people]
    assert same(cohen_kappa(machine_pass, people_pass), reference(metrics.cohen_kappa_score, machine_pass, people_pass))
    c = confusion(machine_pass, people_pass)
    (tn, fp), (fn, tp) = metrics.confusion_matrix(people_pass, machine_pass, labels=[False, True])
    assert (c.both_pass, c.machine_pass_people_fail, c.machine_fail_people_pass, c.both_fail) == (tp, fp, fn, tn)


def test_the_figures_on_the_libraries_own_examples() -> None:
    assert ranks([0, 2, 3, 2]) == [1.0, 2.5, 4.0, 2.5]  # scipy.stats.rankdata's example
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233)  # scipy's docs
    assert mean_absolute_error([3, -0.5, 2, 7], [2.5, 0.0, 2, 8]) == 0.5  # scikit-learn's docs
    assert cohen_kappa([True] * 5, [True] * 5) is None, "one class only: undefined (NaN there)"
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1], [2]) is None


def test_the_suggested_threshold_separates_the_peoples_verdicts_and_says_how_sure_it_is() -> None:
    rng = random.Random(3)
    people_pass = [rng.random() < 0.5 for _ in range(200)]
    scores = [rng.uniform(6.5, 10) if ok else rng.uniform(0, 7.5) for ok in people_pass]
    found = suggest_threshold(scores, people_pass)
    assert found is not None and 6.0 <= found.threshold <= 7.5 and found.balanced_accuracy > 0.85
    assert found.low < found.balanced_accuracy < found.high and found.sure == "firm"
    few = suggest_threshold([2.0, 3.0, 8.0, 9.0], [False, False, True, True])
    assert few is not None and few.threshold == 5.5 and few.balanced_accuracy == 1.0
    assert few.sure == "a hint" and few.low < 0.6, "four rows: perfect, and hardly evidence"
    assert suggest_threshold([5.0, 6.0], [True, True]) is None, "the people never failed one: nothing to separate"


# --- A run's agreement: the figures per column, over the rows people labelled -----------------


def test_a_runs_agreement_matches_the_references_over_the_labelled_rows_it_scored() -> None:
    from scoring.calibration import HumanVerdict, MachineColumn, agreement

    rng = random.Random(44)
    n = 60
    humans: list[HumanVerdict | None] = []
    for i in range(n):
        if i % 7 == 0:
            humans.append(None)  # not labelled: left out everywhere
        elif i % 5 == 0:
            humans.append(HumanVerdict(passed=rng.random() < 0.5))  # a pass/fail alone
        else:
            humans.append(HumanVerdict(rating=float(rng.randint(0, 10))))
    group = [None if i % 11 == 0 else round(rng.uniform(0, 10), 1) for i in range(n)]  # some rows unscored
    judge = [float(rng.randint(0, 10)) for _ in range(n)]
    found = agreement(humans, [MachineColumn("group", "Bar", "g1", group), MachineColumn("judge", "Quality", "q", judge)],
                      ids=[f"r{i}" for i in range(n)], alert_threshold=7.0)
    assert found is not None
    assert found.labelled_rows == sum(h is not None for h in humans)
    assert found.human_ratings == sum(h is not None and h.rating is not None for h in humans)
    for column, values in ((found.group, group), (found.judges[0], judge)):
        scored = [i for i in range(n) if humans[i] is not None and values[i] is not None]
        assert column.labelled_rows == len(scored)
        assert column.unscored_labelled_rows == found.labelled_rows - len(scored)
        rated = [i for i in scored if humans[i].rating is not None]  # type: ignore[union-attr]
        machine = [values[i] for i in rated]
        people = [humans[i].rating for i in rated]  # type: ignore[union-attr]
        assert column.spearman == pytest.approx(reference(stats.spearmanr, machine, people).statistic, abs=1e-4)
        assert column.mean_absolute_error == pytest.approx(metrics.mean_absolute_error(people, machine), abs=1e-4)
        gate, alert = column.marks
        assert (gate.mark, gate.threshold, alert.mark, alert.threshold) == ("gate", 5.0, "alertThreshold", 7.0)
        for mark in (gate, alert):
            def people_pass(i: int, at: float = mark.threshold) -> bool:
                h = humans[i]
                assert h is not None
                return h.passed if h.passed is not None else h.rating >= at  # type: ignore[operator]
            m = [values[i] >= mark.threshold for i in scored]  # type: ignore[operator]
            p = [people_pass(i) for i in scored]
            assert mark.kappa == pytest.approx(reference(metrics.cohen_kappa_score, m, p), abs=1e-4)
            (tn, fp), (fn, tp) = metrics.confusion_matrix(p, m, labels=[False, True])
            assert (mark.confusion.both_pass, mark.confusion.machine_pass_people_fail,
                    mark.confusion.machine_fail_people_pass, mark.confusion.both_fail) == (tp, fp, fn, tn)
        assert column.suggested_threshold is not None  # from the alertThreshold's pass/fail: the line people act on
        assert len(column.disagreements) == 5
        gaps = [d.gap for d in column.disagreements]
        assert gaps == sorted(gaps, reverse=True)
        worst = max((abs(values[i] - humans[i].rating) for i in rated), default=0)  # type: ignore[operator,union-attr]
        assert gaps[0] >= worst and column.disagreements[0].id == f"r{column.disagreements[0].row}"


def test_a_run_without_human_verdicts_has_no_agreement_and_what_rows_cannot_tell_is_null() -> None:
    from scoring.calibration import HumanVerdict, MachineColumn, agreement

    column = MachineColumn("group", "Bar", None, [8.0, 9.0, 2.0])
    assert agreement([None, None, None], [column], ids=[None] * 3, alert_threshold=None) is None
    found = agreement([HumanVerdict(passed=True)] * 3, [column], ids=[None] * 3, alert_threshold=None)
    assert found is not None
    only_gate, = found.group.marks
    assert only_gate.kappa == reference(metrics.cohen_kappa_score, [True, True, False], [True] * 3) == 0.0
    both_one_class = agreement([HumanVerdict(passed=True)] * 2, [MachineColumn("group", "Bar", None, [8.0, 9.0])],
                               ids=[None] * 2, alert_threshold=None)
    assert both_one_class is not None and both_one_class.group.marks[0].kappa is None, "sklearn says NaN"
    assert found.group.spearman is None and found.group.mean_absolute_error is None  # no humanRating
    assert found.group.suggested_threshold is None, "no fail rows: nothing to separate"
    # The one row the machine failed and people passed, by how far under the gate mark it erred
    assert [(d.row, d.gap) for d in found.group.disagreements] == [(2, 3.0)]
