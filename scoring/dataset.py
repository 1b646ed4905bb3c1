"""Grading a dataset run with a scorer group: the same panel and blend as live traffic, offline.

The one rule: a row is graded as a live trace is, except that judges that require an expected answer
are allowed here and read the row's ``expected`` (a row without one leaves that member unscorable).
Rows, the run rating and ``gate``: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scorer_groups.agreement import Agreement
from scorer_groups.gates import Allowance, GateColumns, JudgeColumn, breakdown_lines
from scoring.calibration import HumanVerdict, MachineColumn, agreement
from scoring.catalog import CatalogSnapshot
from scoring.errors import InvalidDocument, NotFound
from scoring.judge_calls import encode_calls
from scoring.models import Judge, Member, MemberKind, ScorerGroup
from scoring.panel import GroupResult, Panel
from scoring.ports import BudgetExhausted, JudgeSpend
from scoring.subjects import Subject, as_text
from scoring.verdict_cache import PairVerdicts


@dataclass(frozen=True, slots=True)
class DatasetRow:
    input: str
    output: str
    expected: Any = None
    spans: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    id: str | None = None
    human: HumanVerdict | None = None

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
                   spans, dict(metadata), None if row_id is None else str(row_id),
                   human_verdict(document.get("humanRating"), document.get("humanPass"), f"row {index}: "))

    def subject(self, project_id: str) -> Subject:
        return Subject(scope="trace", input=self.input, output=self.output, expected=self.expected,
                       spans=self.spans, metadata=self.metadata, transcript="", project_id=project_id,
                       agent_id="dataset", trace_id=self.id)


def human_verdict(rating: Any, passed: Any, where: str = "") -> HumanVerdict | None:
    """A row's human verdict, or None without one; a malformed one is refused, saying which field."""
    if rating is None and passed is None:
        return None
    if rating is not None and (isinstance(rating, bool) or not isinstance(rating, int | float)
                               or not 0 <= rating <= 10):
        raise ValueError(f"{where}humanRating must be a number from 0 to 10 (got {rating!r})")
    if passed is not None and not isinstance(passed, bool):
        raise ValueError(f"{where}humanPass must be true or false (got {passed!r})")
    return HumanVerdict(None if rating is None else float(rating), passed)


@dataclass(frozen=True)
class RowResult:
    index: int
    row: DatasetRow
    result: GroupResult

    @property
    def rating(self) -> float | None:
        return self.result.rating

    @property
    def has_calls(self) -> bool:
        return any(m.outcome.calls for m in self.result.blend.members)

    def calls(self) -> bytes:
        """The row's judge calls, as a live result keeps them (b"" when it made none)."""
        return encode_calls([(m.outcome.ref_id, m.outcome.name, m.outcome.calls)
                             for m in self.result.blend.members if m.outcome.calls])

    def wire(self) -> dict[str, Any]:
        """One output line: the group score, then judges as labelled verdicts and
        deterministic members as scorer rows."""
        judges, scorer_rows = [], []
        for member, m in zip(self.result.group.members, self.result.blend.members, strict=True):
            o = m.outcome
            if o.kind == "judge":
                judges.append({"scorerId": o.ref_id, "label": member.label or o.name, "status": m.status,
                               "rating": o.native if o.goodness is not None else None,
                               "justification": o.detail, "error": o.error})
            else:
                scorer_rows.append({"scorerId": o.ref_id, "name": member.label or o.name, "kind": o.kind,
                                    "status": m.status, "native": o.native, "goodness": o.goodness,
                                    "detail": o.detail or o.error})
        b = self.result.blend
        return {"row": self.index, "id": self.row.id, "rating": b.score, "reason": b.reason,
                "justification": b.justification, "judgeScorerResults": judges, "scorerRows": scorer_rows}


@dataclass
class DatasetRun:
    group: ScorerGroup  # a single-scorer run's is a one-member group named after the scorer
    rows: list[RowResult]
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    by_group: bool = True  # False: graded by one scorer (plus additional ones), not by a group
    budget_skipped: list[str] = field(default_factory=list)  # row ids the judge budget had no room for

    @property
    def scored(self) -> list[RowResult]:
        return [r for r in self.rows if r.rating is not None]

    @property
    def rating(self) -> float | None:
        """The run rating: mean group score over the rows that have one."""
        scores = [r.rating for r in self.rows if r.rating is not None]
        return math.fsum(scores) / len(scores) if scores else None

    def judge_labels(self) -> dict[int, str]:
        """member index -> label of each judge member: the label saved with the group (so a
        deleted scorer keeps its name), else its scorer's name; never two members one label."""
        labels: dict[int, str] = {}
        for i, member in enumerate(self.group.members):
            if member.kind == "judge":
                labels[i] = member.label or (self.rows[0].result.blend.members[i].outcome.name
                                             if self.rows else member.ref_id)
        for i, label in labels.items():  # a group saved before labels existed may repeat a name
            if sum(1 for other in labels.values() if other == label) > 1:
                labels[i] = f"{label} [{self.group.members[i].ref_id} #{i}]"
        return labels

    def _judge_ratings(self, index: int) -> list[float | None]:
        ratings: list[float | None] = []
        for r in self.rows:
            o = r.result.blend.members[index].outcome
            ratings.append(float(o.native) if o.goodness is not None and isinstance(o.native, int | float)
                           else None)
        return ratings

    def judge_averages(self) -> dict[str, float | None]:
        """Each judge member's own average rating (0-10) over the rows it scored, by label."""
        averages: dict[str, float | None] = {}
        for index, label in self.judge_labels().items():
            ratings = [v for v in self._judge_ratings(index) if v is not None]
            averages[label] = math.fsum(ratings) / len(ratings) if ratings else None
        return averages

    def columns(self) -> GateColumns:
        """What a gate reads: the group score of each row and each judge member's column."""
        first = self.rows[0].result.blend.members if self.rows else []
        judges = [JudgeColumn(label=label, ref_id=self.group.members[i].ref_id,
                              name=first[i].outcome.scorer_name if first else self.group.members[i].ref_id,
                              ratings=self._judge_ratings(i),
                              errors=[r.result.blend.members[i].outcome.error for r in self.rows])
                  for i, label in self.judge_labels().items()]
        return GateColumns(self.group.name, [r.rating for r in self.rows],
                           [r.result.blend.reason for r in self.rows], judges, by_group=self.by_group)

    def spent(self) -> dict[str, Any]:
        """What its judges cost: the calls made (retries included; verdicts paid for already are
        none), their tokens, and their cost - null when a call's was unknown (an unpriced model:
        a total that left it out would look cheaper than it was), with how many such calls."""
        calls = [call for r in self.rows for m in r.result.blend.members for call in m.outcome.calls
                 if call.cached_from is None]
        made = sum(call.attempts for call in calls)
        tokens = sum(call.usage.total for call in calls if call.usage is not None)
        # a call that answered with no known cost (an unpriced model, no usage reported); one that
        # never answered (refused, timed out) is billed nothing by providers
        unknown = sum(1 for call in calls
                      if call.answer is not None and (call.usage is None or call.usage.cost is None))
        cost = math.fsum(call.usage.cost for call in calls if call.usage is not None and call.usage.cost is not None)
        return {"judgeCalls": made, "tokens": tokens, "cost": None if unknown else cost, "unpricedCalls": unknown}

    def breakdown(self) -> list[str]:
        """The run's breakdown (``breakdown_lines``)."""
        return breakdown_lines(self.group.name, self.by_group, self.rating, len(self.scored), len(self.rows),
                               list(self.judge_averages().items()))

    def summary(self) -> dict[str, Any]:
        graded_by = {"group" if self.by_group else "scorer": {
            "id": self.group.id if self.by_group else self.group.members[0].ref_id, "name": self.group.name}}
        return {**graded_by, "rows": len(self.rows),
                "scoredRows": len(self.scored), "noScoreRows": len(self.rows) - len(self.scored),
                "runRating": self.rating, "judgeAverages": self.judge_averages(),
                "breakdown": self.breakdown(), "spend": self.spent(), "warnings": self.warnings, "notes": self.notes,
                **({"agreement": self.agreement.wire()} if self.agreement is not None else {})}

    @functools.cached_property
    def agreement(self) -> Agreement | None:
        """How far the group and each judge member agree with the rows' human verdicts (once:
        the summary and the CLI's lines both read it)."""
        columns = self.columns()
        machine = [MachineColumn("group", self.group.name, self.group.id if self.by_group else None, columns.ratings)]
        machine += [MachineColumn("judge", j.label, j.ref_id, j.ratings) for j in columns.judges]
        online = self.group.online
        return agreement([r.row.human for r in self.rows], machine, ids=[r.row.id for r in self.rows],
                         alert_threshold=online.alert_threshold if online is not None else None)

    def gate(self, fail_under: float, scorer: str | None = None, allow_unscored: Allowance = 0) -> float:
        """See ``GateColumns.gate``."""
        return self.columns().gate(fail_under, scorer, allow_unscored)


@dataclass(frozen=True)
class GradingPlan:
    """What a run is graded with, after the spec's rules for the request's fields: warnings for
    what was ignored, notes for what was done that the request may not make obvious."""

    group: ScorerGroup
    warnings: list[str]
    notes: list[str] = field(default_factory=list)
    additional_scorer_ids: list[str] | None = None  # None: nulled (a group grades the run alone)


def plan_grading(catalog: CatalogSnapshot, *, scorer_group_id: str | None = None,
                 scorer_id: str | None = None, additional_scorer_ids: Iterable[str] = (),
                 project_id: str | None = None) -> GradingPlan:
    """``scorer_group_id`` and ``scorer_id`` are mutually exclusive: the group wins when both
    are sent, and a group-graded run nulls any additional scorers (the group is the whole
    grading recipe, not a layer on top of one). A single scorer is graded as a one-member group,
    and additional scorers are a layer on top of it: graded alongside, reported on every row
    (judges among the verdicts, others as scorer rows), never part of the rating.
    ``project_id`` limits the run to that project's documents (and the shared scorers)."""
    additional = list(dict.fromkeys(additional_scorer_ids))
    warnings: list[str] = []
    if scorer_group_id is not None:
        group = catalog.groups.get(scorer_group_id)
        if group is None or project_id not in (None, group.project_id):
            raise NotFound(f"no scorer group with id {scorer_group_id!r}")
        if scorer_id is not None:
            warnings.append(f"scorer_id {scorer_id!r} ignored: scorer_group_id and scorer_id are "
                            "mutually exclusive and the group wins")
        if additional:
            warnings.append(f"additional_scorer_ids nulled ({', '.join(additional)} not graded): the "
                            f"group wins, and a run graded by group {group.name!r} is graded by the "
                            "group alone")
        return GradingPlan(group, warnings, additional_scorer_ids=None)
    if scorer_id is None:
        raise InvalidDocument("give scorer_group_id (or scorer_id)")
    project = project_id or "dataset"
    members = [_single_member(catalog, scorer_id, 1, project_id)]
    members += [_single_member(catalog, extra, 0, project_id) for extra in additional if extra != scorer_id]
    name = _scorer_name(catalog, members[0])
    notes = []
    if len(members) > 1:
        notes.append(f"additional scorers graded alongside {name!r}: "
                     f"{', '.join(m.ref_id for m in members[1:])} are reported on every row and do "
                     "not change the rating")
    group = ScorerGroup(id=f"single:{scorer_id}", name=name, project_id=project, members=members)
    return GradingPlan(group, warnings, notes, additional_scorer_ids=additional)


def _single_member(catalog: CatalogSnapshot, scorer_id: str, weight: float, project_id: str | None) -> Member:
    kinds: tuple[MemberKind, ...] = ("judge", "pattern", "custom")
    for kind in kinds:
        scorer = catalog.scorer(kind, scorer_id)
        if scorer is not None and (project_id is None or scorer.project_id in (None, project_id)):
            return Member(kind=kind, ref_id=scorer_id, weight=weight, gate=False, label=scorer.name)
    raise NotFound(f"no scorer with id {scorer_id!r}")


def _scorer_name(catalog: CatalogSnapshot, member: Member) -> str:
    scorer = catalog.scorer(member.kind, member.ref_id)
    return scorer.name if scorer is not None else member.ref_id


async def grade_rows(panel: Panel, catalog: CatalogSnapshot, plan: GradingPlan, rows: list[DatasetRow],
                     *, concurrency: int = 8, progress: Callable[[int, int], None] | None = None,
                     spends: Mapping[str, JudgeSpend] | None = None,
                     verdicts: Sequence[PairVerdicts | None] | None = None) -> DatasetRun:
    """Grade every row with the plan's group, at most ``concurrency`` rows at once. ``spends``
    (by row id) is each row's share of a judge budget, for the calls decided while it is graded
    (retries, a gates-first group's judges); a row that finds no room there is not graded, and
    its id is in the run's ``budget_skipped``. ``verdicts`` (one per row, in order): what the
    verdict cache holds for each row's judges (``services.unclaimed_verdicts``)."""
    slots = asyncio.Semaphore(concurrency)
    done = 0

    async def one(index: int, row: DatasetRow) -> RowResult | None:
        nonlocal done
        spend = spends.get(str(row.id)) if spends is not None else None
        found = verdicts[index] if verdicts is not None else None
        async with slots:
            try:
                result = await panel.score(plan.group, row.subject(plan.group.project_id), catalog, spend=spend,
                                           verdicts=found)
            except BudgetExhausted:
                result = None
        done += 1
        if progress is not None:
            progress(done, len(rows))
        return None if result is None else RowResult(index, row, result)

    results = await asyncio.gather(*(one(i, row) for i, row in enumerate(rows)))
    return DatasetRun(plan.group, [r for r in results if r is not None], list(plan.warnings), list(plan.notes),
                      by_group=plan.additional_scorer_ids is None,
                      budget_skipped=[str(row.id) for row, r in zip(rows, results, strict=True) if r is None])


def requires_expected_judges(group: ScorerGroup, catalog: CatalogSnapshot) -> list[Judge]:
    judges = [catalog.judge(m.ref_id) for m in group.members if m.kind == "judge"]
    return [j for j in judges if j is not None and j.requires_expected]
