"""The alignment run's pure rules (scoring.alignment), where the choice matters: which labelled
cases a candidate's examples hold out (by source, or by an output written by hand), and how
``better`` breaks a tie of Spearman (the mean absolute error decides)."""

from __future__ import annotations

from scorer_groups.alignments import Figure, JudgeFigures
from scoring.alignment import Case, better, split
from scoring.models import JudgeExample


def figures(spearman: float | None, mae: float | None, cases: int = 20) -> JudgeFigures:
    def fig(v: float | None) -> Figure | None:
        return None if v is None else Figure(value=v, low=v, high=v)
    return JudgeFigures(cases=cases, spearman=fig(spearman), mean_absolute_error=fig(mae))


def test_at_equal_spearman_the_lower_mean_absolute_error_is_better() -> None:
    assert better(figures(0.8, 2.0), figures(0.8, 1.5))
    assert not better(figures(0.8, 1.5), figures(0.8, 2.0)), "a worse MAE at the same Spearman is not better"
    assert better(figures(0.8, 1.5), figures(0.8, 1.5)), "equal on both: at least as good"


def test_spearman_decides_before_the_error_and_the_error_decides_without_it() -> None:
    assert better(figures(0.5, 1.0), figures(0.9, 3.0)), "a higher Spearman wins whatever its MAE"
    assert not better(figures(0.9, 3.0), figures(0.5, 1.0))
    assert better(figures(None, 2.0), figures(None, 1.0)) and not better(figures(None, 1.0), figures(None, 2.0))


def case(n: int, output: str | None = None) -> Case:
    return Case(f"ds:1:{n}", f"question {n}", output or f"answer {n}", float(n % 10))


def test_an_example_holds_out_the_case_it_came_from_and_any_case_with_its_output() -> None:
    cases = [case(n) for n in range(40)]
    by_source = JudgeExample(id="a", input="q", output="something else", rating=3, source="ds:1:4")
    by_hand = JudgeExample(id="b", input="written by hand", output="  answer 7 ", rating=3)  # no source
    own, tune, evaluated = split(cases, [by_source, by_hand])
    assert [c.id for c in own] == ["ds:1:4", "ds:1:7"]
    assert "ds:1:7" not in {c.id for c in tune + evaluated} and "ds:1:4" not in {c.id for c in tune + evaluated}
    assert len(own) + len(tune) + len(evaluated) == 40
