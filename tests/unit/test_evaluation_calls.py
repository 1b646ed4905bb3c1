"""A dataset run keeps its rows' judge calls within a budget, the rows a failed gate sends people
to first: the unscored, then the lowest rated (adapters.stores.evaluations.kept_calls)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from adapters.stores.evaluations import calls_left_out_note, kept_calls
from scoring.dataset import DatasetRun


@dataclass
class _Row:
    id: str


@dataclass
class _Graded:  # what kept_calls reads of a scoring.dataset.RowResult
    row: _Row
    rating: float | None
    kept: bytes

    encoded: int = 0

    @property
    def has_calls(self) -> bool:
        return bool(self.kept)

    def calls(self) -> bytes:
        self.encoded += 1
        return self.kept


def _run(*rows: tuple[int, float | None, int]) -> DatasetRun:
    graded = [_Graded(_Row(str(index)), rating, b"x" * size) for index, rating, size in rows]
    return cast(DatasetRun, type("Run", (), {"rows": graded})())


def test_the_unscored_then_the_lowest_rated_rows_are_kept_first_within_the_budget() -> None:
    run = _run((0, 9.0, 100), (1, 2.0, 100), (2, None, 100), (3, 5.0, 100), (4, 1.0, 0))
    kept, left_out = kept_calls(run, budget=300)
    assert sorted(kept) == [1, 2, 3] and left_out == 1, "row 4 made no call; row 0, rated best, did not fit"
    assert kept[2] == b"x" * 100


def test_rows_are_encoded_in_order_and_none_past_the_first_that_does_not_fit() -> None:
    run = _run((0, 1.0, 250), (1, 2.0, 100), (2, 3.0, 40), (3, 9.0, 10))
    kept, left_out = kept_calls(run, budget=300)
    assert sorted(kept) == [0] and left_out == 3
    assert [row.encoded for row in run.rows] == [1, 1, 0, 0], "the work is the budget's, not the run's"  # type: ignore[attr-defined]


def test_the_runs_note_says_how_many_rows_calls_are_not_kept() -> None:
    assert calls_left_out_note(1).startswith("the judge calls of 1 row are not kept: a run keeps 16 MiB")
    assert calls_left_out_note(3).startswith("the judge calls of 3 rows are not kept")


