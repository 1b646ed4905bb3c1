"""Which groups score a trace, and what each (group, subject) pair reserves.

The step between a decoded trace and the claims: the project's live trace-scope groups, each
kept or not by a stable sample, each with the claim that dedupes the pair and reserves its judge
calls in the project's budget. The session sweeper (which also waits for a session to be idle)
builds its pairs with ``pair_of`` too. Knows nothing of Kafka.
"""

from __future__ import annotations

from scoring.catalog import CatalogSnapshot
from scoring.frozen import frozen
from scoring.judge_prompt import token_ceiling
from scoring.models import ScorerGroup
from scoring.pairs import ClaimRequest, day_of
from scoring.panel import planned_judges, upfront_judge_calls
from scoring.sampling import keep
from scoring.subjects import Subject, Trace, trace_subject

DEFAULT_BUDGET_WINDOW_S = 3600  # the window a claim names when its project has no budget


@frozen
class Pair:
    """One (group, subject) to score, with the claim that reserves it."""

    group: ScorerGroup
    subject: Subject
    claim: ClaimRequest


def pair_of(group: ScorerGroup, subject: Subject, snapshot: CatalogSnapshot, *, subject_key: str,
            day: int) -> Pair:
    """The pair and its claim, kept under the group's own project (never another tenant's) and
    reserving the judge calls its panel will make within that project's budget, if it has one
    (a gates-first group's judges reserve later, once its cheap gates passed)."""
    budget = snapshot.budget(group.project_id)
    token_limit = budget.tokens_cap if budget else None
    calls = upfront_judge_calls(group, snapshot, subject)
    return Pair(group, subject, ClaimRequest(
        project_id=group.project_id, group_id=group.id, subject_key=subject_key, judge_calls=calls,
        budget_limit=budget.calls_cap if budget else None,
        budget_window_s=budget.window_seconds if budget else DEFAULT_BUDGET_WINDOW_S, day=day,
        # The prompts are built to measure them only under a token budget.
        judge_tokens=(sum(token_ceiling(j, subject) for j in planned_judges(group, snapshot, subject))
                      if calls and token_limit is not None else 0),
        token_limit=token_limit))


def trace_pairs(trace: Trace, snapshot: CatalogSnapshot) -> list[Pair]:
    """The project's live trace-scope groups that keep this trace (a stable sample)."""
    groups = snapshot.live_groups(trace.project_id, "trace")
    if not groups:
        return []
    subject = trace_subject(trace)
    day = day_of(trace.timestamp.timestamp())  # the trace's own time: the same on redelivery
    return [pair_of(group, subject, snapshot, subject_key=f"trace:{trace.trace_id}", day=day)
            for group in groups
            if group.online is not None
            and keep(trace.trace_id, group.online.sample_rate, group.online.sample_salt or "")]
