"""The wire documents of datasets and evaluation runs: what the API answers and the SDK parses
(a dataset and its rows; a run, its subject, the agent's outputs, and each judge member's
column). Pure: ``adapters.stores.datasets`` and ``adapters.stores.evaluations`` keep them in Redis."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, JsonValue, field_validator

from scorer_groups.agreement import Agreement
from scorer_groups.api_models import MAX_EXAMPLE_EXTRAS_CHARS, MAX_EXAMPLE_SPANS
from scorer_groups.gates import GateColumns, JudgeColumn
from scorer_groups.models import Id, Name, WireModel


class DatasetItem(WireModel):
    """One row: what the agent is given, optionally the answer it should give, and optionally
    what people said of it - ``humanRating`` (0-10) and/or ``humanPass`` - against which a run
    measures its judges (``agreement``)."""

    input: JsonValue
    expected: JsonValue = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    # The answer already given (a review queue's export: what the agent said live), for ``grade``
    # to grade as it stands; absent from rows an agent answers when the run is made.
    output: str | None = Field(None, exclude_if=lambda v: v is None)
    # Left out when absent, so that a row without them reads in 0.2 SDKs (which refuse fields they do not know).
    human_rating: float | None = Field(None, ge=0, le=10, exclude_if=lambda v: v is None)
    human_pass: bool | None = Field(None, exclude_if=lambda v: v is None)

    @field_validator("input")
    @classmethod
    def _has_input(cls, value: JsonValue) -> JsonValue:
        if value is None or value == "":
            raise ValueError("every row needs an input")
        return value


class Dataset(WireModel):
    id: Id
    project_id: Id
    name: Name
    description: str | None = Field(None, max_length=2000)
    version: int = Field(ge=1)  # the latest version
    row_count: int = Field(ge=0)  # of the latest version
    created_at: float
    updated_at: float


Status = Literal["created", "completed"]


class RunSubject(WireModel):
    """Who answered the rows, as the spec's ``subject={"kind": "custom_agent", "displayName": ...}``."""

    kind: Literal["custom_agent"] = "custom_agent"
    display_name: Name


class EvaluationCreate(WireModel):
    dataset_id: Id
    subject: RunSubject
    scorer_group_id: Id | None = None
    scorer_id: Id | None = None
    additional_scorer_ids: list[Id] | None = Field(None, max_length=20)
    dataset_version: int | None = Field(None, ge=1)
    # False: every judge asked afresh - verdicts already paid for (the verdict cache) neither read
    # nor kept. Absent when true.
    cache: bool = Field(True, exclude_if=lambda v: v)


class AgentAnswer(WireModel):
    """What an agent may return for a row instead of its bare output: the output and the spans of
    its run (``{"spanId", "parentSpanId", "name", "kind", "input", "output"}``), which members
    read as they read a live trace's - a faithfulness judge reads the ``retriever`` spans'
    outputs."""

    output: JsonValue
    spans: list[dict[str, JsonValue]] = Field(default_factory=list, max_length=MAX_EXAMPLE_SPANS)


class RowOutput(WireModel):
    """The agent's answer on one row (its output, and the spans of its run if it gave them), or
    why there is none."""

    row: int = Field(ge=0)
    output: JsonValue = None
    # Left out when empty, so that 0.3 servers read a body that sends none.
    spans: list[dict[str, JsonValue]] = Field(default_factory=list, max_length=MAX_EXAMPLE_SPANS,
                                              exclude_if=lambda v: not v)
    error: str | None = Field(None, max_length=2000)

    @field_validator("spans")
    @classmethod
    def _spans_bounded(cls, spans: list[dict[str, JsonValue]]) -> list[dict[str, JsonValue]]:
        # What members are sent of them: as much as a playground example's extras (a live trace's).
        size = len(json.dumps(spans, separators=(",", ":"))) if spans else 0
        if size > MAX_EXAMPLE_EXTRAS_CHARS:
            raise ValueError(f"{size} characters of JSON, at most {MAX_EXAMPLE_EXTRAS_CHARS}")
        return spans


class Outputs(WireModel):
    outputs: list[RowOutput] = Field(max_length=10_000)


class JudgeSummary(WireModel):
    """A judge member over the run: its label, average, and rating (or error) on each row."""

    label: str
    scorer_id: str
    name: str
    average: float | None
    ratings: list[float | None]
    errors: list[str | None]


class JudgeSpendTotals(WireModel):
    """What a run's judges cost: the calls made (retries included; verdicts paid for already are
    none), their tokens, and their cost in the operators' currency - null when a call's cost was
    unknown (a model without a price), with how many such calls."""

    judge_calls: int
    tokens: int
    cost: float | None
    unpriced_calls: int


class EvaluationRun(WireModel):
    id: Id
    project_id: Id
    dataset_id: Id
    dataset_version: int
    subject: RunSubject
    scorer_group_id: Id | None
    scorer_id: Id | None
    additional_scorer_ids: list[Id] | None  # null on a group-graded run: the group is the whole recipe
    cache: bool = Field(True, exclude_if=lambda v: v)  # false: graded without the verdict cache
    status: Status
    row_count: int
    # What the rating column is: the group (``groupName``) on a group-graded run, else the single
    # scorer (``scorerName``); the other is null.
    group_name: str | None = None
    scorer_name: str | None = None
    warnings: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    created_at: float
    finalized_at: float | None = None
    rating: float | None = None  # the run rating: mean group score over the rows that have one
    scored_rows: int = 0
    no_score_rows: int = 0
    breakdown: list[str] = Field(default_factory=list)
    judges: list[JudgeSummary] = Field(default_factory=list)
    rows: list[dict[str, Any]] = Field(default_factory=list)  # one result per row, in row order
    # Rows the project's judge budget had no room for (all of a row's judge calls, or none):
    # not graded, so rows without a score. Left out when none, so that 0.3 SDKs read the run.
    budget_skipped_rows: list[int] = Field(default_factory=list, exclude_if=lambda v: not v)
    # What its judges cost, once completed (absent before, and on runs completed before it existed).
    spend: JudgeSpendTotals | None = Field(None, exclude_if=lambda v: v is None)
    # With the rows' human verdicts, when some carry one (absent otherwise: 0.2 SDKs read the run).
    agreement: Agreement | None = Field(None, exclude_if=lambda v: v is None)

    def columns(self) -> GateColumns:
        """What a gate reads (``scorer_groups.gates.GateColumns``)."""
        return GateColumns(self.group_name or self.scorer_name or "", [r.get("rating") for r in self.rows],
                           [r.get("reason") for r in self.rows],
                           [JudgeColumn(j.label, j.scorer_id, j.name, j.ratings, j.errors) for j in self.judges],
                           by_group=self.group_name is not None)
