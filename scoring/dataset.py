"""Grading a dataset run with a scorer group: the same panel and blend as live traffic, offline.

Each row (``input``, ``output``, optional ``expected``, ``spans``, ``metadata``) is graded by
every member; the group's aggregate fills the row's rating, judge members surface as labelled
verdicts and deterministic members as scorer rows. The run rating is the mean group score over
the rows that have one (rows without a score are counted apart), and ``gate`` turns a run into
a CI verdict: on the group score, or on one judge member's own average.

Unlike live scoring, judges that require an expected answer are allowed here: they read the
row's ``expected``, and a row without one leaves that member unscorable.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scoring.catalog import CatalogSnapshot
from scoring.models import Judge, Member, MemberKind, ScorerGroup
from scoring.panel import GroupResult, Panel
from scoring.subjects import Subject, as_text


class GateFailed(Exception):
    """A CI gate did not pass; the message says which and by how much."""


@dataclass(frozen=True, slots=True)
class DatasetRow:
    input: str
    output: str
    expected: Any = None
    spans: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str | None = None

    @classmethod
    def from_json(cls, document: Mapping[str, Any], index: int) -> DatasetRow:
        if not isinstance(document, Mapping):
            raise ValueError(f"row {index}: must be a JSON object")
        missing = [k for k in ("input", "output") if k not in document]
        if missing:
            raise ValueError(f"row {index}: missing {', '.join(missing)}")
        spans, metadata = document.get("spans") or [], document.get("metadata") or {}
        if not isinstance(spans, list) or not isinstance(metadata, Mapping):
            raise ValueError(f"row {index}: spans must be a list and metadata an object")
        row_id = document.get("id")
        return cls(as_text(document["input"]), as_text(document["output"]), document.get("expected"),
                   spans, dict(metadata), None if row_id is None else str(row_id))

    def subject(self, project_id: str) -> Subject:
        return Subject(scope="trace", input=self.input, output=self.output, expected=self.expected,
                       spans=self.spans, metadata=self.metadata, transcript="", project_id=project_id,
                       agent_id="dataset", trace_id=self.id)


@dataclass(frozen=True)
class RowResult:
    index: int
    row: DatasetRow
    result: GroupResult

    @property
    def rating(self) -> float | None:
        return self.result.rating

    def wire(self) -> dict[str, Any]:
        """One output line: the group score, then judges as labelled verdicts and
        deterministic members as scorer rows."""
        judges, scorer_rows = [], []
        for m in self.result.blend.members:
            o = m.outcome
            if o.kind == "judge":
                judges.append({"scorerId": o.ref_id, "label": o.name, "status": m.status,
                               "rating": o.native if o.goodness is not None else None,
                               "justification": o.detail, "error": o.error})
            else:
                scorer_rows.append({"scorerId": o.ref_id, "name": o.name, "kind": o.kind,
                                    "status": m.status, "native": o.native, "goodness": o.goodness,
                                    "detail": o.detail or o.error})
        b = self.result.blend
        return {"row": self.index, "id": self.row.id, "rating": b.score, "reason": b.reason,
                "justification": b.justification, "judgeScorerResults": judges, "scorerRows": scorer_rows}


@dataclass
class DatasetRun:
    group: ScorerGroup
    rows: list[RowResult]
    warnings: list[str] = field(default_factory=list)

    @property
    def scored(self) -> list[RowResult]:
        return [r for r in self.rows if r.rating is not None]

    @property
    def rating(self) -> float | None:
        """The run rating: mean group score over the rows that have one."""
        scores = [r.rating for r in self.rows if r.rating is not None]
        return math.fsum(scores) / len(scores) if scores else None

    def judge_averages(self) -> dict[str, float | None]:
        """Each judge member's own average rating (0-10) over the rows it scored."""
        averages: dict[str, float | None] = {}
        for member_index, member in enumerate(self.group.members):
            if member.kind != "judge" or not self.rows:
                continue
            name = self.rows[0].result.blend.members[member_index].outcome.name
            ratings = [float(o.native) for r in self.rows
                       if (o := r.result.blend.members[member_index].outcome).goodness is not None
                       and isinstance(o.native, int | float)]
            averages[name] = math.fsum(ratings) / len(ratings) if ratings else None
        return averages

    def breakdown(self) -> list[str]:
        """The run's breakdown, led by "<Name> (group)"."""
        def show(v: float | None) -> str:
            return "no score" if v is None else f"{v:.2f}"

        lines = [f"{self.group.name} (group): {show(self.rating)} "
                 f"({len(self.scored)} of {len(self.rows)} rows scored)"]
        lines += [f"{name}: {show(avg)}" for name, avg in self.judge_averages().items()]
        return lines

    def summary(self) -> dict[str, Any]:
        return {"group": {"id": self.group.id, "name": self.group.name}, "rows": len(self.rows),
                "scoredRows": len(self.scored), "noScoreRows": len(self.rows) - len(self.scored),
                "runRating": self.rating, "judgeAverages": self.judge_averages(),
                "breakdown": self.breakdown(), "warnings": self.warnings}

    def gate(self, fail_under: float, scorer: str | None = None) -> float:
        """Pass when the group score (or the named judge member's own average) is at least
        ``fail_under``; raise GateFailed saying which and by how much otherwise."""
        if scorer is None:
            value, what = self.rating, f"group {self.group.name!r} score"
        else:
            averages = self.judge_averages()
            if scorer not in averages:
                known = ", ".join(averages) or "none"
                raise GateFailed(f"no judge member named {scorer!r} in group {self.group.name!r} "
                                 f"(judge members: {known})")
            value, what = averages[scorer], f"judge {scorer!r} average"
        if value is None:
            raise GateFailed(f"gate failed: {what} has no score on any row (needs >= {fail_under:g})")
        if value < fail_under:
            raise GateFailed(f"gate failed: {what} is {value:.2f}, under {fail_under:g} "
                             f"by {fail_under - value:.2f}")
        return value


@dataclass(frozen=True)
class GradingPlan:
    """What a run is graded with, after the spec's rules for the request's fields."""

    group: ScorerGroup
    warnings: list[str]


def plan_grading(catalog: CatalogSnapshot, *, scorer_group_id: str | None = None,
                 scorer_id: str | None = None,
                 additional_scorer_ids: Iterable[str] = ()) -> GradingPlan:
    """``scorer_group_id`` and ``scorer_id`` are mutually exclusive: the group wins when both
    are sent, and a group-graded run drops any additional scorers (the group is the whole
    grading recipe). A single scorer alone is graded as a one-member group."""
    additional = list(additional_scorer_ids)
    warnings = []
    if scorer_group_id is not None:
        group = catalog.groups.get(scorer_group_id)
        if group is None:
            raise ValueError(f"no scorer group with id {scorer_group_id!r}")
        if scorer_id is not None:
            warnings.append(f"scorer_id {scorer_id!r} ignored: scorer_group_id and scorer_id are "
                            "mutually exclusive and the group wins")
        if additional:
            warnings.append(f"additional scorers dropped ({', '.join(additional)}): a group-graded "
                            "run is graded by the group alone")
        return GradingPlan(group, warnings)
    if scorer_id is None:
        raise ValueError("give scorer_group_id (or scorer_id)")
    kinds: tuple[MemberKind, ...] = ("judge", "pattern", "custom")
    found = [(kind, scorer) for kind in kinds if (scorer := catalog.scorer(kind, scorer_id)) is not None]
    if not found:
        raise ValueError(f"no scorer with id {scorer_id!r}")
    kind, scorer = found[0]
    group = ScorerGroup(id=f"single:{scorer_id}", name=scorer.name, project_id="dataset",
                        members=[Member(kind=kind, ref_id=scorer_id, weight=1, gate=False)])
    return GradingPlan(group, warnings)


async def grade_rows(panel: Panel, catalog: CatalogSnapshot, plan: GradingPlan, rows: list[DatasetRow],
                     *, concurrency: int = 8,
                     progress: Callable[[int, int], None] | None = None) -> DatasetRun:
    """Grade every row with the plan's group, at most ``concurrency`` rows at once."""
    slots = asyncio.Semaphore(concurrency)
    done = 0

    async def one(index: int, row: DatasetRow) -> RowResult:
        nonlocal done
        async with slots:
            result = await panel.score(plan.group, row.subject(plan.group.project_id), catalog)
        done += 1
        if progress is not None:
            progress(done, len(rows))
        return RowResult(index, row, result)

    results = await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
    return DatasetRun(plan.group, list(results), list(plan.warnings))


def requires_expected_judges(group: ScorerGroup, catalog: CatalogSnapshot) -> list[Judge]:
    judges = [catalog.judge(m.ref_id) for m in group.members if m.kind == "judge"]
    return [j for j in judges if j is not None and j.requires_expected]
