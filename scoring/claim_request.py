"""A (subject, group) pair, as the pair protocol claims it: which project, group and subject,
how many judge calls to reserve, under which budget, and the day its claim is kept under.

Pure: ``scoring.routing`` builds the requests, ``adapters.stores.claims`` keeps them in Redis.
"""

from __future__ import annotations

from dataclasses import field

from scoring.frozen import frozen
from scoring.prices import NO_RATES, Rates

DAY_S = 86_400


@frozen
class ClaimRequest:
    project_id: str
    group_id: str
    subject_key: str  # "trace:<traceId>", "session:<sessionId>:<turns>" or span_key(...)
    judge_calls: int  # slots to reserve, all or nothing
    calls_cap: int | None  # calls per window; None = no budget configured (unlimited, counted)
    budget_window_s: int = 3600
    # With a token budget: the ceiling of those calls' tokens (``judge_prompt.token_ceiling``),
    # reserved with them, all or nothing; settled to the real usage once the pair is done.
    judge_tokens: int = 0
    tokens_cap: int | None = None  # tokens per window; None = no token budget
    # Money (``scoring.prices``), in nanos of the currency: with a cap - the project's per window
    # (``cost_cap``), the group's per day (``group_cost_cap``) - a reservation of calls and
    # their token ceiling also reserves their cost ceiling at ``rates``, settled to what they cost.
    rates: Rates = field(default=NO_RATES, kw_only=True)
    cost_cap: int | None = field(default=None, kw_only=True)
    group_cost_cap: int | None = field(default=None, kw_only=True)
    # The subject's own day (``day_of``: a trace's timestamp, a session's first turn), the same
    # on every redelivery: the hash its claim is kept in.
    day: int = field(kw_only=True)
    # The group's revision (``CatalogSnapshot.revision``): kept in the pair's done mark, so a
    # backfill knows a pair rated under another revision (a changed rubric) is still to grade.
    revision: str = field(default="", kw_only=True)

    @property
    def counts_cost(self) -> bool:
        return self.cost_cap is not None or self.group_cost_cap is not None

    @property
    def counts_tokens(self) -> bool:
        """Are its calls' token ceilings reserved (a token cap, or a money cap: their cost)?"""
        return self.tokens_cap is not None or self.counts_cost

    def cost(self, calls: int, tokens: int) -> int:
        """The cost ceiling of ``calls`` judge calls of ``tokens`` token ceiling, in nanos (0
        without a money cap: nothing to count)."""
        return self.rates.cost(calls, tokens) if self.counts_cost else 0


def day_of(epoch_s: float) -> int:
    """The day (since 1970-01-01, UTC) a subject's claim is kept under."""
    return int(epoch_s // DAY_S)


def span_key(trace_id: str, span_id: str) -> str:
    """The subject key of one step (span scope). The trace id's length comes first: ids are the
    tenants' text, and trace "a:b" with span "c" must not be trace "a" with span "b:c"."""
    return f"span:{len(trace_id)}:{trace_id}:{span_id}"
