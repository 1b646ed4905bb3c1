"""The pair protocol: the steps every (group, subject) pair goes through, whichever loop runs it -
the trace loop (a pair per kept trace and group) or the session sweeper (a pair per quiet
conversation and group):

1. claim: dedupe, and reserve the judge calls all or nothing (``Claims.claim_many``; the loops
   claim their batch and read the states themselves);
2. score, with the pair's spend: a gates-first group reserves its judges once its gates passed
   and each retry takes a slot; no room means the pair is skipped for budget, whole;
3. confirm the lease right before publishing: a pair another worker took over (this one stalled
   past its lease) is not published from here;
4. publish the rating, Signal and deliveries;
5. record: the ratings history, the group's latest results, session verdicts;
6. mark done and settle the pair's judge tokens - or, when a step before 4 fails, release.

``PairSteps`` holds steps 2 and 4-6 and the accounting of pairs skipped for budget; each loop
decides how many pairs take a step at once (the trace loop batches steps 3, 5 and 6 across its
jobs; the sweeper takes them a chunk at a time).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable

import structlog

from consumers.events import PipelineEvents
from consumers.outputs import Outputs
from scoring.catalog import CatalogSnapshot
from scoring.pairs import ClaimRequest
from scoring.panel import GroupResult, Panel
from scoring.ports import BudgetExhausted
from scoring.records import record
from scoring.results import RatingEvent, ResultScope, history_event, tokens_of
from scoring.routing import Pair
from scoring.stores.claims import Claims, PairSpend, Reservation
from scoring.stores.ratings import RatingsStore, SessionVerdict

log = structlog.get_logger(__name__)


@record
class Finished:
    """A published pair, for steps 5 and 6: what the history counts, the done mark, the tokens
    to settle and - at session scope - the verdict the SDK reads."""

    claim: ClaimRequest
    rating_id: str
    event: RatingEvent
    tokens: int = 0  # the usage the judges reported, less the ceilings reserved
    verdict: SessionVerdict | None = None


@record
class Scored:
    """A pair with its result, and the spend it was scored with."""

    pair: Pair
    result: GroupResult
    spend: PairSpend | None = None  # None: nothing to settle (no judge could have been called)


class PairSteps:
    def __init__(self, claims: Claims, outputs: Outputs, ratings: RatingsStore, events: PipelineEvents) -> None:
        self.claims = claims
        self._outputs = outputs
        self._ratings = ratings
        self._events = events
        # Pairs skipped for budget since the last ``record_skipped``, by group: the ratings history
        # shows them beside no-score results, so a starved group is seen, not silent.
        self.starved: Counter[str] = Counter()

    # 2. score

    def spend(self, pair: Pair, reserve: Callable[[Reservation], Awaitable[bool]] | None = None) -> PairSpend:
        return self.claims.spend(pair.claim, reserve)

    async def score(self, panel: Panel, pair: Pair, snapshot: CatalogSnapshot, spend: PairSpend) -> GroupResult | None:
        """The pair's result, or None when its gates-first judges found no room in the budget
        (the pair is then marked skipped for budget, as a claim that found none would be)."""
        try:
            return await panel.score(pair.group, pair.subject, snapshot, spend=spend)
        except BudgetExhausted:
            self.skipped_for_budget(pair, when="its gates passed")
            return None

    def skipped_for_budget(self, pair: Pair, **why: str) -> None:
        subject = pair.subject
        where = {"session": subject.session_id} if subject.scope == "session" else {"trace": subject.trace_id}
        self._events.group_skipped(pair.claim.project_id, pair.group.id, "budget")
        log.warning("judge budget exhausted; group skipped", project=pair.claim.project_id, group=pair.group.id,
                    **where, **why)
        self.starved[pair.group.id] += 1

    async def record_skipped(self) -> None:
        """Count the pairs skipped for budget into the ratings history (one round trip)."""
        if self.starved:
            counts, self.starved = dict(self.starved), Counter()
            await self._ratings.record_skipped(counts, time.time())

    # 4. publish

    async def publish(self, scored: list[Scored], scope: ResultScope, snapshot: CatalogSnapshot) -> list[Finished]:
        """Publish the pairs' outputs (acknowledged by the broker on return); what steps 5 and 6
        need of each."""
        published = await self._outputs.publish([s.result for s in scored], scope, snapshot)
        finished = []
        for s, p in zip(scored, published, strict=True):
            verdict = (SessionVerdict(p.session_id or "", p.group_id, p.rating, p.justification,
                                      p.scored_at.timestamp())
                       if scope == "session" else None)
            tokens = s.spend.settlement(tokens_of(s.result)) if s.spend is not None else 0
            finished.append(Finished(s.pair.claim, p.id, history_event(s.pair.group, p, p.document), tokens, verdict))
        return finished

    # 5 and 6. record, then mark done

    async def finish(self, items: list[Finished]) -> None:
        """History, latest results and verdicts first: a pair marked done is never scored again,
        so what it counts must exist by then. Then the done marks, settling tokens in passing."""
        await self._ratings.record([i.event for i in items], [i.verdict for i in items if i.verdict is not None])
        await self.claims.mark_done([(i.claim, i.rating_id) for i in items],
                                    tokens=[(i.claim, i.tokens) for i in items if i.tokens])
