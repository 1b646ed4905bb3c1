"""Alignment runs' wire models: a candidate judge - new criteria, examples or model -
against the current one, on people's labels the candidate never saw, before it goes live.
``POST /v1/judges/{id}/alignments`` starts one, ``GET .../alignments/{alignmentId}`` reads it,
``POST /v1/judges/{id}/promote`` makes its candidate the judge."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from scorer_groups.models import MAX_JUDGE_EXAMPLES, Id, JudgeExample, Text
from scorer_groups.wire import WireModel

AlignmentState = Literal["running", "done", "failed", "interrupted"]


class Candidate(WireModel):
    """What changes: any of the judge's criteria, examples (the whole new set) and model."""

    criteria: Text | None = None
    examples: list[JudgeExample] | None = Field(None, max_length=MAX_JUDGE_EXAMPLES)
    model: str | None = Field(None, max_length=200)


class AlignmentRequest(WireModel):
    """The candidate and the labels it is measured on: a dataset's rows with a ``humanRating`` and
    an ``output`` (``dataset``, its latest version or ``version``), or a review queue's labelled
    items (``queue``)."""

    candidate: Candidate
    dataset: Id | None = None
    version: int | None = Field(None, ge=1)
    queue: Id | None = None
    # Also run the candidate on live traffic beside the judge for this long: a shadow of each live
    # group of the judge's project that has it, on the same sample, publishing ratings only.
    shadow_hours: int | None = Field(None, ge=1, le=168)

    @model_validator(mode="after")
    def _one_source(self) -> AlignmentRequest:
        if (self.dataset is None) == (self.queue is None):
            raise ValueError("give dataset or queue: the labels the candidate is measured on (one of them)")
        return self


class Figure(WireModel):
    """A figure over the held-out cases, with its 95% bootstrap interval (None: the cases cannot
    give it - fewer than two, or no spread)."""

    value: float
    low: float
    high: float


class JudgeFigures(WireModel):
    """One judge's agreement with people over the held-out cases it scored."""

    cases: int
    spearman: Figure | None = None
    kappa: Figure | None = None  # pass/fail at the alignment's mark
    mean_absolute_error: Figure | None = None


class ChangedVerdict(WireModel):
    """A held-out case the candidate grades otherwise: across the mark, or 2 points or more apart."""

    case_id: str
    input: str  # the first 300 characters
    human: float
    current: float | None
    candidate: float | None


class CaseCounts(WireModel):
    labelled: int  # cases with a human rating and the texts to grade
    held_out_as_examples: int  # the candidate's own examples: never graded by it
    tune: int  # set apart for examples (deterministic split): not graded
    evaluated: int  # graded by both judges
    budget_skipped: int  # of those, not graded: no room in the judge budget


class Shadow(WireModel):
    """A live group and its shadow: the same group with the candidate in the judge's place."""

    group_id: str
    shadow_id: str


class Alignment(WireModel):
    id: str
    judge_id: str
    project_id: str | None
    state: AlignmentState
    done: int = 0  # graded so far (both judges), of total
    total: int = 0
    source: str  # "dataset:<id>:<version>" or "queue:<id>"
    mark: float  # the pass/fail mark kappa reads (5)
    candidate: Candidate
    judge_etag: str  # the judge as it was when the run began: promote refuses if it changed since
    counts: CaseCounts | None = None
    current: JudgeFigures | None = None
    candidate_figures: JudgeFigures | None = None
    better: bool | None = None  # the candidate agrees at least as well (Spearman, then MAE) on these cases
    changed: list[ChangedVerdict] = Field(default_factory=list)
    tune_case_ids: list[str] = Field(default_factory=list)  # where examples may be drawn from next
    error: str | None = None
    shadows: list[Shadow] = Field(default_factory=list)  # removed on promotion, or by DELETE .../shadow
    shadow_until: datetime | None = None
    created_at: datetime
    updated_at: datetime  # a running run is saved every few seconds: long silent, it was interrupted
    finished_at: datetime | None = None
    promoted_at: datetime | None = None
    promoted_by: str | None = None


class PromoteRequest(WireModel):
    alignment: str = Field(max_length=100)
    force: bool = False


class JudgeDisagreement(WireModel):
    """``GET /v1/judges/{id}/disagreements``: a labelled review item where the judge and people
    are far apart - a natural example to add (``fromItem``)."""

    item_id: str
    queue_id: str
    group_id: str
    judge: float  # the judge's verdict, as the result recorded it
    people: float  # the median of the item's reviewers' ratings
    gap: float
    labels: int
    input: str  # the first 300 characters
    output: str
