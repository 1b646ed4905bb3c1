"""What the ratings history counts of the traffic beside its results: pairs skipped for the
judge budget (shown beside no-score results, so that a starved group is seen, not silent) and
traces that matched a group's filter (the traffic it is aimed at); and each project's records by
hour (what a backfill's estimate scales by: the tenant's own traffic, never the shared topic's).
Counted as pairs are claimed and traces routed, written once a commit interval in one round trip.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter

import structlog

from adapters.stores.ratings import RatingsStore
from consumers.events import PipelineEvents
from consumers.outage import OutageGuard
from scoring.routing import Pair

log = structlog.get_logger(__name__)

COUNTS_WRITE_S = 1.0  # a count write the trace loop's tick does not wait longer for
BUDGET_LOG_EVERY_S = 60.0  # a group skipped for budget is logged once a minute at most


class TrafficCounts:
    """``counting`` False (a backfill's pairs, which are not traffic): nothing is counted."""

    def __init__(self, ratings: RatingsStore, outages: OutageGuard, events: PipelineEvents, *,
                 counting: bool = True) -> None:
        self._ratings, self._outages, self._events, self._counting = ratings, outages, events, counting
        self.starved: Counter[str] = Counter()  # pairs skipped for budget since the last write, by group
        self.matched: Counter[str] = Counter()  # traces that matched a group's filter, by group
        self.traffic: Counter[tuple[str, int]] = Counter()  # records by (project, hour of their timestamp)
        self._budget_logged: dict[str, tuple[float, int]] = {}  # group -> (last line, skips since)

    def skipped_for_budget(self, pair: Pair, **why: str) -> None:
        """Counted every time (the metric, the history); logged once a minute per group at most,
        with how many were skipped since: a starved group at 1,000 traces/s is one line, not 1,000.
        Not traffic's (a backfill's): not skipped, the job pauses and says so."""
        if not self._counting:
            return
        self._events.group_skipped(pair.claim.project_id, pair.group.id, "budget")
        self.starved[pair.group.id] += 1
        now = time.monotonic()
        logged_at, unlogged = self._budget_logged.get(pair.group.id, (None, 0))
        if logged_at is not None and now - logged_at < BUDGET_LOG_EVERY_S:
            self._budget_logged[pair.group.id] = (logged_at, unlogged + 1)
            return
        self._budget_logged[pair.group.id] = (now, 0)
        subject = pair.subject
        where = ({"session": subject.session_id} if subject.scope == "session" else
                 {"trace": subject.trace_id, **({"span": subject.span_id} if subject.span_id else {})})
        since = {"skipped_since_last_line": unlogged} if unlogged else {}
        log.warning("judge budget exhausted; group skipped", project=pair.claim.project_id, group=pair.group.id,
                    **where, **why, **since)

    async def write(self, *, wait: bool = True) -> None:
        """Write the counts into the ratings history (one round trip). Counted as they are read:
        a redelivered trace is counted again. Without ``wait``, a write that fails keeps its
        counts for the next one instead of waiting out an outage (the trace loop's tick: counts
        must not hold back its commits)."""
        if not self._counting:
            self.starved.clear()
            self.matched.clear()
            self.traffic.clear()
        if not (self.starved or self.matched or self.traffic):
            return
        skipped, matched, traffic = dict(self.starved), dict(self.matched), dict(self.traffic)
        self.starved, self.matched, self.traffic = Counter(), Counter(), Counter()
        write = functools.partial(self._ratings.write_counts, time.time(), skipped=skipped, matched=matched,
                                  traffic=traffic)
        if wait:
            await self._outages.call(write)
            return
        try:
            await asyncio.wait_for(write(), timeout=COUNTS_WRITE_S)
        except Exception:  # Redis away or slow: the next tick writes them, with what came since
            self.starved.update(skipped)
            self.matched.update(matched)
            self.traffic.update(traffic)
