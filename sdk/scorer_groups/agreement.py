"""How far a run's judges agree with people: the ``agreement`` of a run over rows that carry a
human verdict (``humanRating`` 0-10, or ``humanPass``). Wire models only; the server computes
them (``scoring.calibration``).

For the group (its score) and for each judge member (its own 0-10 rating), over the labelled rows
it scored:

- ``spearman`` and ``meanAbsoluteError`` against ``humanRating`` (rows without one are left out);
- at each mark - the gate mark (goodness 0.5: 5 of 10) and the group's ``alertThreshold`` - the
  pass/fail confusion and Cohen's kappa. People pass a row by its ``humanPass``, else by its
  ``humanRating`` at the same mark;
- the ``suggestedThreshold`` that best separates the people's pass from their fail, with how
  sure it is for the number of rows behind it;
- the rows of largest disagreement.

A figure the rows cannot give (fewer than two, no spread, one class only) is null.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scorer_groups.wire import WireModel

GATE_MARK = 5.0  # goodness 0.5 on the 0-10 scale: where a must-pass member passes


class Confusion(WireModel):
    """Pass/fail at one mark: the machine's verdict against the people's."""

    both_pass: int
    machine_pass_people_fail: int
    machine_fail_people_pass: int
    both_fail: int


class AtMark(WireModel):
    mark: Literal["gate", "alertThreshold"]
    threshold: float
    rows: int
    kappa: float | None
    confusion: Confusion


class SuggestedThreshold(WireModel):
    """The cut (pass at or above it) with the best balanced accuracy on these rows."""

    threshold: float
    balanced_accuracy: float
    low: float  # the 95% Wilson interval of the balanced accuracy
    high: float
    passes: int  # the people's pass rows behind it
    fails: int
    sure: Literal["a hint", "fair", "firm"]  # under 10 rows of either class: a hint; under 30: fair


class Disagreement(WireModel):
    row: int
    id: str | None = None
    machine: float
    human_rating: float | None = None
    human_pass: bool | None = None
    gap: float  # |machine - humanRating|; for humanPass alone, how far past the gate mark it erred


class AgreementColumn(WireModel):
    kind: Literal["group", "judge"]
    label: str  # the group's (or the single scorer's) name, or the judge member's label
    scorer_id: str | None = None
    labelled_rows: int  # rows with a human verdict that this column scored
    unscored_labelled_rows: int  # rows with a human verdict this column has no score for
    spearman: float | None = None
    mean_absolute_error: float | None = None
    marks: list[AtMark] = Field(default_factory=list)
    suggested_threshold: SuggestedThreshold | None = None
    disagreements: list[Disagreement] = Field(default_factory=list)


class Agreement(WireModel):
    labelled_rows: int  # rows with a human verdict
    human_ratings: int  # of which with a humanRating
    group: AgreementColumn
    judges: list[AgreementColumn] = Field(default_factory=list)

    def column(self, label: str) -> AgreementColumn:
        """A judge member's column by label (or scorer id), or the group's by its name."""
        for column in [self.group, *self.judges]:
            if label in (column.label, column.scorer_id):
                return column
        known = ", ".join(c.label for c in [self.group, *self.judges])
        raise KeyError(f"no agreement column {label!r} (known: {known})")

    def lines(self) -> list[str]:
        """A few lines for a person: each column's figures and its suggested threshold."""
        out = [f"agreement with people: {self.labelled_rows} labelled rows ({self.human_ratings} with a humanRating)"]
        for c in [self.group, *self.judges]:
            figures = [f"{c.labelled_rows} rows"]
            if c.spearman is not None:
                figures.append(f"spearman {c.spearman:.2f}")
            if c.mean_absolute_error is not None:
                figures.append(f"MAE {c.mean_absolute_error:.2f}")
            figures += [f"kappa {m.kappa:.2f} at {'the gate mark' if m.mark == 'gate' else 'alertThreshold'} "
                        f"{m.threshold:g}" for m in c.marks if m.kappa is not None]
            s = c.suggested_threshold
            if s is not None:
                figures.append(f"suggested threshold {s.threshold:g} (balanced accuracy {s.balanced_accuracy:.2f}, "
                               f"{s.sure}: {s.passes} pass / {s.fails} fail rows)")
            out.append(f"  {c.kind} {c.label!r}: " + ", ".join(figures))
        return out
