"""Calibration figures (issue 44) held to the reference libraries' on random data - Spearman's
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
