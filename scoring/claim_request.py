"""A (subject, group) pair, as the pair protocol claims it: which project, group and subject,
how many judge calls to reserve, under which budget, and the day its claim is kept under.

Pure: ``scoring.routing`` builds the requests, ``scoring.stores.claims`` keeps them in Redis.
"""

from __future__ import annotations

from dataclasses import field

from scoring.frozen import frozen

DAY_S = 86_400


@frozen
class ClaimRequest:
    project_id: str
    group_id: str
    subject_key: str  # "trace:<traceId>", "session:<sessionId>:<turns>" or span_key(...)
    judge_calls: int  # slots to reserve, all or nothing
    budget_limit: int | None  # calls per window; None = no budget configured (unlimited, counted)
    budget_window_s: int = 3600
    # With a token budget: the ceiling of those calls' tokens (``judge_prompt.token_ceiling``),
    # reserved with them, all or nothing; settled to the real usage once the pair is done.
    judge_tokens: int = 0
    token_limit: int | None = None  # tokens per window; None = no token budget
    # The subject's own day (``day_of``: a trace's timestamp, a session's first turn), the same
    # on every redelivery: the hash its claim is kept in.
    day: int = field(kw_only=True)
    # The group's revision (``CatalogSnapshot.revision``): kept in the pair's done mark, so a
    # backfill knows a pair rated under another revision (a changed rubric) is still to grade.
    revision: str = field(default="", kw_only=True)


def day_of(epoch_s: float) -> int:
    """The day (since 1970-01-01, UTC) a subject's claim is kept under."""
    return int(epoch_s // DAY_S)


def span_key(trace_id: str, span_id: str) -> str:
    """The subject key of one step (span scope). The trace id's length comes first: ids are the
    tenants' text, and trace "a:b" with span "c" must not be trace "a" with span "b:c"."""
    return f"span:{len(trace_id)}:{trace_id}:{span_id}"
