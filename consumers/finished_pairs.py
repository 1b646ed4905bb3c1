"""What a published pair leaves for the pair protocol's steps 5 and 6 (``consumers.pair_protocol``):
the history's entry (with what its judge calls cost), the settlement of the tokens and money its
claim and panel reserved, at session scope the verdict the SDK reads, its review items, the judge
verdicts it paid for (the verdict cache keeps them) and what the cache saved it - and, counted as
it is built, its calls' cost and its cache hits. One pair at a time; no I/O."""

from __future__ import annotations

from adapters.stores.claims import PairSpend, Settlement
from adapters.stores.ratings import SessionVerdict
from adapters.stores.verdicts import Paid
from consumers.events import PipelineEvents
from scoring.claim_request import ClaimRequest
from scoring.frozen import frozen
from scoring.panel import GroupResult
from scoring.results import HistoryEntry, PublishedRating, ResultScope, cost_of, history_entry, tokens_of
from scoring.review_rules import Kept
from scoring.routing import Pair
from scoring.verdict_cache import CachedVerdict, Savings, savings


@frozen
class Scored:
    """A pair with its result, and the spend it was scored with."""

    pair: Pair
    result: GroupResult
    spend: PairSpend | None = None  # None: nothing to settle (no judge could have been called)


@frozen
class Finished:
    """A published pair, for steps 5 and 6: what the history counts, the done mark, the tokens
    and money to settle and - at session scope - the verdict the SDK reads."""

    claim: ClaimRequest
    rating_id: str
    entry: HistoryEntry
    settled: tuple[Settlement, ...] = ()  # tokens and money: what was used less the ceilings reserved
    verdict: SessionVerdict | None = None
    review: tuple[Kept, ...] = ()  # the review queues' items it makes
    paid: tuple[Paid, ...] = ()  # the judge verdicts it paid for, for the verdict cache
    saved: Savings = Savings()  # what the verdict cache saved it (the budget window counts it)


def finished(s: Scored, rating: PublishedRating, scope: ResultScope, review: tuple[Kept, ...], *,
             history_at_subject: bool, events: PipelineEvents) -> Finished:
    """``s`` once published as ``rating``; its judge calls' cost and its verdict cache hits
    counted in ``events``."""
    claim, members = s.pair.claim, s.result.blend.members
    verdict = (SessionVerdict(rating.session_id or "", rating.group_id, rating.rating, rating.justification,
                              rating.scored_at.timestamp()) if scope == "session" else None)
    settled = tuple(s.spend.settlements(tokens_of(s.result), cost_of(s.result))) if s.spend else ()
    entry = history_entry(s.pair.group, rating, rating.document, s.pair.subject.at if history_at_subject else None,
                          s.result)
    for m in members:  # what its judge calls cost, in money (scoring.prices)
        for call in m.outcome.calls:
            if call.usage is not None and call.usage.cost:
                events.judge_cost(claim.project_id, s.pair.group.id, call.model, call.usage.cost)
    saved = savings((m.outcome for m in members), s.pair.verdicts)
    if saved.hits or saved.misses:
        events.verdict_cache(claim.project_id, saved.hits, saved.misses, saved.tokens)
    paid = tuple(Paid(claim.project_id, key, CachedVerdict(v.rating, v.justification, rating.id, v.usage))
                 for key, v in s.pair.verdicts.fresh.items())
    return Finished(claim, rating.id, entry, settled, verdict, review, paid, saved)
