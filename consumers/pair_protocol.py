"""The pair protocol, one module by design: the six steps of every (group, subject) pair have one owner.

Whichever loop runs a pair (the trace loop, the session sweep): 1. claim, 2. score with the pair's spend,
3. confirm the lease, 4. publish (shielded), 5. record, 6. mark done - or release when a step before 4
fails. The one rule: a pair another worker took over is never published from here, and a publish under
way is never cancelled halfway. The steps, ``alone`` and ``together``: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import time
import uuid
from typing import Literal, Protocol

import structlog

from adapters.stores.claims import ClaimResult, Claims, PairSpend, Reservation, ReserveCalls
from adapters.stores.ratings import RatingsStore
from adapters.stores.review_items import ReviewItems
from consumers.all_of import all_of
from consumers.batcher import Batcher
from consumers.events import SILENT, PipelineEvents
from consumers.finished_pairs import Finished, Scored
from consumers.finished_pairs import finished as finished_pair
from consumers.outage import OutageGuard, not_the_subjects_fault
from consumers.outputs import Outputs
from consumers.pauses import PauseWatch
from consumers.traffic_counts import TrafficCounts
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import ClaimRequest
from scoring.frozen import frozen
from scoring.models import ScorerGroup
from scoring.panel import GroupResult, Panel
from scoring.ports import BudgetExhausted
from scoring.prices import Pricing
from scoring.results import ResultScope, rating_id
from scoring.routing import Pair
from scoring.verdict_cache import CachedVerdict

log = structlog.get_logger(__name__)

BUSY_POLL_S = 0.5  # how often a pair leased by another worker is looked at again
# Done marks and history wait up to this long for more pairs to share their Redis call. Short: a
# pair published but not yet marked done is scored again should this worker die meanwhile (a
# judge may then answer differently under the same rating id), so the window stays small.
FINISH_LINGER_S = 0.05
# A pair's rating waits this long at most for other pairs' confirmations to share its call.
CONFIRM_LINGER_S = 0.02

class Fate(enum.Enum):
    """What became of a pair."""

    PUBLISHED = "published"  # its rating was published from here
    DECIDED = "decided"  # decided without a rating from here: rated or skipped by another worker
    REFUSED = "refused"  # skipped for budget (or a job's cap on judge calls)
    LEFT = "left"  # left to another worker, or to the next sweep
    BROKE = "broke"  # the subject itself broke scoring (a malformed trace): not the infrastructure's


@frozen
class PairOutcome:
    """A pair's fate, and for ``BROKE`` the exception the subject raised (the trace is
    dead-lettered with it)."""

    fate: Fate
    error: Exception | None = None


PUBLISHED, DECIDED, REFUSED, LEFT = (PairOutcome(f) for f in (Fate.PUBLISHED, Fate.DECIDED, Fate.REFUSED, Fate.LEFT))


class CallCap(Protocol):
    """A ceiling on judge calls above the project's budget (a backfill's ``maxJudgeCalls``):
    taken before the budget is asked, given back when the budget refuses."""

    async def take(self, calls: int) -> bool: ...

    async def give(self, calls: int) -> None: ...


class PairProtocol:
    def __init__(self, *, claims: Claims, outputs: Outputs, ratings: RatingsStore, panel: Panel,
                 outages: OutageGuard, events: PipelineEvents | None = None, pauses: PauseWatch | None = None,
                 finish_batch: int = 32, finish_linger_s: float = FINISH_LINGER_S) -> None:
        self.claims = claims
        self._outputs = outputs
        self._ratings = ratings
        self._panel = panel
        self._outages = outages
        self._events: PipelineEvents = events or SILENT
        self.pauses = pauses or PauseWatch()
        # What the ratings history counts of the traffic beside its results (skipped for budget,
        # matched by a filter): a backfill's pairs are not traffic, and count nothing.
        self.counts = TrafficCounts(ratings, outages, self._events, counting=outputs.policy.traffic_counts)
        # Claims held and not yet publishing: what to give up when the work is cancelled.
        self.unpublished: set[ClaimRequest] = set()
        self._publishing: set[asyncio.Task[None]] = set()
        # What stopped the protocol: an output that could not be published, or the infrastructure
        # failing under scoring - recorded at once, so the trace loop stops fetching at once.
        self.failure: BaseException | None = None
        self.finisher: Batcher[Finished, None] = Batcher(self._finish, max_items=finish_batch,
                                                         max_wait_s=finish_linger_s)
        self._confirmer: Batcher[ClaimRequest, bool] = Batcher(self._confirm_many, max_wait_s=CONFIRM_LINGER_S)
        self._reserver: Batcher[Reservation, bool] = Batcher(self._reserve_many)

    @functools.cached_property
    def _reviews(self) -> ReviewItems:  # review items: kept where the results are counted
        return ReviewItems(self._ratings.redis)

    @property
    def pricing(self) -> Pricing:  # what judge calls cost: the pairs' money caps reserve at it
        return self._panel.pricing

    def start(self) -> None:
        self.finisher.start()
        self._confirmer.start()
        self._reserver.start()

    async def close(self, deadline_s: float) -> None:
        """Give up the claims of work that never started (cancelled before its first step), let
        publishes under way finish within ``deadline_s`` (their pairs are then marked done), write
        what the batchers hold."""
        if self.unpublished:
            claims, self.unpublished = list(self.unpublished), set()
            with contextlib.suppress(Exception):
                await self.claims.release(claims)
        if self._publishing:  # shielded: they finish (outputs acknowledged, marked done)
            _, running = await asyncio.wait(self._publishing, timeout=deadline_s)
            if running:  # outputs perhaps out, not marked done: their pairs may be scored again
                log.error("publishes did not finish in time", publishes=len(running))
                self.failure = self.failure or TimeoutError(f"{len(running)} publishes did not finish in time")
        await self._confirmer.stop()
        await self._reserver.stop()
        await self.finisher.stop()
        with contextlib.suppress(Exception):  # counts only: written if Redis answers now, never waited for
            await self.counts.write()

    def waits(self, group: ScorerGroup, snapshot: CatalogSnapshot) -> bool:
        """Does the group wait on the network (judges, external scorers)? If not, its pairs can
        be scored together, in bulk."""
        return self._panel.waits(group, snapshot)

    # --- 1. claim --------------------------------------------------------------------------------

    async def claim(self, pairs: list[Pair], snapshot: CatalogSnapshot) -> list[ClaimResult]:
        """Claim a batch in one round trip; each pair's state (claimed, busy, done, skipped,
        exhausted) in order. An exhausted pair is skipped for budget here. Its judges' verdicts
        already paid for - in Redis, or by a call of this process, done or under way - reserve
        nothing (``scoring.verdict_cache``)."""
        requests = [pair.claim for pair in pairs]
        policy = self._panel.verdict_cache
        lookups = self._verdict_lookups(pairs, snapshot) if policy is not None else None
        now = time.time()  # the windows it reserves in, and so settles in
        buckets = policy.reading(now) if policy is not None else ()
        states = await self._outages.call(lambda: self.claims.claim_many(requests, now, lookups=lookups,
                                                                         verdict_buckets=buckets))
        for pair, state in zip(pairs, states, strict=True):
            if state.state == "claimed":
                self.unpublished.add(pair.claim)  # ours from here: given up if the work is cancelled
                pair.verdicts.claimed_at = now
                if lookups is not None:
                    self._found(pair, state)
            elif state.state == "exhausted":
                self.counts.skipped_for_budget(pair, used=state.detail)
        return states

    def _verdict_lookups(self, pairs: list[Pair], snapshot: CatalogSnapshot) -> list[list[tuple[str | None, int]]]:
        """Per pair, its judges' verdict keys for the claim to look up, and their token ceilings;
        a key this process paid for just now, or is paying for, goes as None: no call to reserve."""
        flights = self._panel.flights
        lookups = []
        for pair in pairs:
            verdicts = pair.verdicts
            calls = self._panel.verdict_keys(pair.group, snapshot, pair.subject)  # a judge named twice: twice
            verdicts.keys = {k.judge_id: k for k in calls}
            if verdicts.keys:  # what its verdicts say paid for them, once published
                verdicts.rating_id = rating_id(pair.group.id, pair.claim.subject_key)
            for k in verdicts.keys.values():
                if (known := flights.known(k.key)) is not None:
                    verdicts.hits[k.key] = known
            lookups.append([(None if flights.flying(k.key) else k.key, k.tokens) for k in calls])
        return lookups

    def _found(self, pair: Pair, state: ClaimResult) -> None:
        verdicts = pair.verdicts
        verdicts.reserved = set(state.leads)
        verdicts.tokens_reserved = state.tokens
        verdicts.cost_reserved = state.cost
        for key, entry in state.cached:
            if (verdict := CachedVerdict.decode(entry)) is not None:
                verdicts.hits[key] = verdict

    # --- one pair that waits ---------------------------------------------------------------------

    async def alone(self, pair: Pair, snapshot: CatalogSnapshot, scope: ResultScope, *, busy: bool,
                    claimed_at: float, cap: CallCap | None = None) -> PairOutcome:
        """Steps 2-6 for one pair; ``busy``: another worker (or job) holds it - wait until it is
        done, or its lease runs out and it is ours. ``cap``: what the judge calls decided while
        it is scored (gates-first judges, retries) also take from."""
        reserve = self._reserve_one if cap is None else self._capped(cap)
        spend = self.claims.spend(pair.claim, reserve, pair.verdicts.tokens_reserved, pair.verdicts.cost_reserved,
                                  pair.verdicts.claimed_at)
        try:
            return await self._alone(pair, snapshot, scope, busy, claimed_at, spend, reserve)
        except asyncio.CancelledError:
            await self._release_cancelled([pair])
            raise
        except Exception as exc:  # only the infrastructure's (_alone returns the subject's)
            self._stopped_by(exc, [pair])
            raise

    def _capped(self, cap: CallCap) -> ReserveCalls:
        async def reserve(reservation: Reservation) -> bool:
            if not await cap.take(reservation.calls):
                return False
            if await self._reserve_one(reservation):
                return True
            await cap.give(reservation.calls)
            return False

        return reserve

    async def _alone(self, pair: Pair, snapshot: CatalogSnapshot, scope: ResultScope, busy: bool,
                     claimed_at: float, spend: PairSpend,
                     reserve: ReserveCalls) -> PairOutcome:
        try:
            began = time.monotonic()
            result = await self._score(pair, busy, snapshot, spend)
            while not isinstance(result, PairOutcome):
                if self.pauses.failed_through(result, began):
                    await self._rescore_after_pause([pair])  # then claimed and scored afresh, just below
                elif (await self._held([(pair.claim, claimed_at)]))[0]:
                    break
                spend = self.claims.spend(pair.claim, reserve)
                began = claimed_at = time.monotonic()  # claimed again (no earlier than this) in _score
                result = await self._score(pair, True, snapshot, spend)
        except Exception as exc:
            if not_the_subjects_fault(exc):
                raise  # the loop stops without committing (see _stopped_by)
            self.unpublished.discard(pair.claim)
            with contextlib.suppress(Exception):
                await self.claims.release([pair.claim])
            return PairOutcome(Fate.BROKE, exc)
        self.unpublished.discard(pair.claim)  # from here on it is published, or was decided elsewhere
        if isinstance(result, PairOutcome):
            return result
        await self._publish([Scored(pair, result, spend)], snapshot, scope, alone=True)
        return PUBLISHED

    async def _score(self, pair: Pair, busy: bool, snapshot: CatalogSnapshot,
                     spend: PairSpend) -> GroupResult | PairOutcome:
        """Step 2 (for a pair another worker holds: once it is ours); ``DECIDED`` when the pair
        was decided meanwhile, ``REFUSED`` when its judges found no budget."""
        while busy:
            await asyncio.sleep(BUSY_POLL_S)
            now = time.time()
            (claim,) = await self._outages.call(functools.partial(self.claims.claim_many, [pair.claim], now))
            if claim.state in ("done", "skipped", "exhausted"):
                self._events.group_skipped(pair.claim.project_id, pair.group.id,
                                           "budget" if claim.state == "exhausted" else "dedupe")
                return REFUSED if claim.state == "exhausted" else DECIDED
            busy = claim.state == "busy"
            if not busy:
                self.unpublished.add(pair.claim)  # ours now: given back if the work is cancelled
                # Claimed without a look-up: every judge call it reserves upfront is reserved (a
                # gates-first pair's: none yet), and this pair makes them.
                keys = pair.verdicts.keys.values()
                pair.verdicts.reserved = {k.key for k in keys} if pair.claim.judge_calls else set()
                spend.tokens_reserved = pair.claim.judge_tokens if spend.counts_tokens else 0
                spend.cost_reserved = pair.claim.cost(pair.claim.judge_calls, spend.tokens_reserved)
                spend.claimed_at, spend.later = now, []
        try:
            return await self._panel.score(pair.group, pair.subject, snapshot, spend=spend,
                                           verdicts=pair.verdicts if pair.verdicts.keys else None)
        except BudgetExhausted:
            self.counts.skipped_for_budget(pair, when="its gates passed")
            return REFUSED

    # --- pairs scored together -------------------------------------------------------------------

    async def together(self, pairs: list[Pair], snapshot: CatalogSnapshot, scope: ResultScope, *,
                       claimed_at: float, lost: Literal["wait", "leave"]) -> list[PairOutcome]:
        """Steps 2-6 for pairs claimed at ``claimed_at``, published in one batch; each pair's
        outcome, in order. Groups that wait on nothing are scored in bulk (one sandbox message
        per code scorer); the others each with its spend, at once."""
        if not pairs:
            return []
        try:
            return await self._together(pairs, snapshot, scope, claimed_at, lost)
        except asyncio.CancelledError:
            await self._release_cancelled(pairs)
            raise
        except Exception as exc:  # only the infrastructure's (a subject's is its pair's outcome)
            self._stopped_by(exc, pairs)
            raise

    async def _release_cancelled(self, pairs: list[Pair]) -> None:
        """Work cancelled (a shutdown): the leases of its pairs not yet publishing are given up at
        once, for another worker to take without waiting them out. A courtesy - leases expire
        anyway - whose failure never replaces why the work ended."""
        claims = [pair.claim for pair in pairs if pair.claim in self.unpublished]
        self.unpublished.difference_update(claims)
        if claims:
            with contextlib.suppress(Exception):
                await self.claims.release(claims)

    def _stopped_by(self, exc: BaseException, pairs: list[Pair]) -> None:
        """Work the infrastructure stopped: the protocol records it at once (the trace loop stops
        fetching), and the pairs keep their leases - Redis may not answer a release, and the
        worker stops and is restarted anyway; the leases run out."""
        self.failure = self.failure or exc
        self.unpublished.difference_update(pair.claim for pair in pairs)

    async def _together(self, pairs: list[Pair], snapshot: CatalogSnapshot, scope: ResultScope,
                        claimed_at: float, lost: Literal["wait", "leave"]) -> list[PairOutcome]:
        began = time.monotonic()
        outcomes: list[PairOutcome] = [DECIDED] * len(pairs)
        scored: list[tuple[int, Scored]] = []
        in_bulk = not any(self._panel.waits(pair.group, snapshot) for pair in pairs)
        if in_bulk:
            try:
                results = await self._panel.score_many([(pair.group, pair.subject) for pair in pairs], snapshot)
                scored = [(i, Scored(pair, result)) for i, (pair, result) in enumerate(zip(pairs, results,
                                                                                           strict=True))]
            except Exception as exc:
                if not_the_subjects_fault(exc):
                    raise
                in_bulk = False  # some subject broke scoring: each pair scored on its own finds which
        if not in_bulk:
            spends = [self.claims.spend(pair.claim, self._reserve_one, pair.verdicts.tokens_reserved,
                                        pair.verdicts.cost_reserved, pair.verdicts.claimed_at) for pair in pairs]
            answers = await asyncio.gather(*(self._score(pair, False, snapshot, spend)
                                             for pair, spend in zip(pairs, spends, strict=True)),
                                           return_exceptions=True)
            for i, (pair, spend, answer) in enumerate(zip(pairs, spends, answers, strict=True)):
                if isinstance(answer, BaseException):
                    if not_the_subjects_fault(answer) or not isinstance(answer, Exception):
                        raise answer
                    self.unpublished.discard(pair.claim)
                    with contextlib.suppress(Exception):
                        await self.claims.release([pair.claim])
                    outcomes[i] = PairOutcome(Fate.BROKE, answer)
                elif isinstance(answer, PairOutcome):
                    self.unpublished.discard(pair.claim)  # decided elsewhere, or refused for budget
                    outcomes[i] = answer
                else:
                    scored.append((i, Scored(pair, answer, spend)))
        # 3. A member failed while the process stood still: hand the pair back.
        again = [item for item in scored if self.pauses.failed_through(item[1].result, began)]
        if again:
            await self._rescore_after_pause([s.pair for _, s in again])
            scored = [item for item in scored if item not in again]
        # 3. Still ours? Pairs another worker took over meanwhile are not published from here.
        held = await self._held([(s.pair.claim, claimed_at) for _, s in scored])
        lost_pairs = [item for item, ours in zip(scored, held, strict=True) if not ours] + again
        scored = [item for item, ours in zip(scored, held, strict=True) if ours]
        for i, s in scored:
            self.unpublished.discard(s.pair.claim)  # from here on the pair is published (shielded)
            outcomes[i] = PUBLISHED
        for _, s in lost_pairs:
            self.unpublished.discard(s.pair.claim)  # another's now, or handed back: not ours to give back
        if lost == "leave":
            for i, _ in lost_pairs:
                outcomes[i] = LEFT
            if scored:
                await self._publish([s for _, s in scored], snapshot, scope, alone=False)
            return outcomes
        async def publish_scored() -> PairOutcome:
            if scored:
                await self._publish([s for _, s in scored], snapshot, scope, alone=False)
            return PUBLISHED

        _, *waited = await all_of(publish_scored(), *(self.alone(s.pair, snapshot, scope, busy=True,
                                                                 claimed_at=claimed_at) for _, s in lost_pairs))
        for (i, _), outcome in zip(lost_pairs, waited, strict=True):
            outcomes[i] = outcome
        return outcomes

    # --- 3. still ours? ----------------------------------------------------------------------------

    async def _rescore_after_pause(self, pairs: list[Pair]) -> None:
        """Give up the leases of pairs scored through a pause, to claim them again (their judge
        calls reserved anew) and score them afresh - or leave them to a worker that took them."""
        log.warning("a member failed while the process stood still; scoring its pair again",
                    pairs=len(pairs), pauses=self.pauses.pauses)
        self._events.rescored_after_pause(len(pairs))
        claims = [pair.claim for pair in pairs]
        await self._outages.call(lambda: self.claims.release(claims))

    async def _held(self, claims: list[tuple[ClaimRequest, float]]) -> list[bool]:
        """Whether this worker still holds each claim (taken no earlier than the monotonic time
        given with it). A lease expires only with time: one taken less than half its length ago
        has not - the clock here ran at least as long as the server's since - so only older ones
        (a stall, a long judge) are asked about, and renewed, batched with the other jobs'
        (``Claims.confirm``). A Redis failover that loses writes loses done marks and budget
        alike: that is replication's to prevent (persistence, replicas in sync), not a lease's.
        """
        now = time.monotonic()
        held = [True] * len(claims)
        stale = [i for i, (_, claimed_at) in enumerate(claims) if now - claimed_at >= self.claims.lease_s / 2]
        if stale:
            for i, ours in zip(stale, await self._confirmer.submit([claims[i][0] for i in stale]), strict=True):
                held[i] = ours
        return held

    # --- 4-6. publish, record, mark done ------------------------------------------------------------

    async def _publish(self, scored: list[Scored], snapshot: CatalogSnapshot, scope: ResultScope, *,
                       alone: bool) -> None:
        """Shielded: a publish under way finishes (and its pairs are marked done) even if the job
        that started it is cancelled."""
        publishing = asyncio.create_task(self._publish_and_finish(scored, snapshot, scope, alone))
        self._publishing.add(publishing)
        publishing.add_done_callback(self._publishing.discard)
        await asyncio.shield(publishing)

    async def _publish_and_finish(self, scored: list[Scored], snapshot: CatalogSnapshot, scope: ResultScope,
                                  alone: bool) -> None:
        try:
            published = await self._outages.call(
                lambda: self._outputs.publish([s.result for s in scored], scope, snapshot))
            finished = [finished_pair(s, p, scope, tuple(published.review_items.get(p.id, ())),
                                      history_at_subject=self._outputs.policy.history_at_subject, events=self._events)
                        for s, p in zip(scored, published.ratings, strict=True)]
            await self.finisher.submit(finished)
        except Exception as exc:
            self.failure = self.failure or exc
            log.error("publishing a result failed; the worker stops without committing it" if alone else
                      "publishing results failed; the worker stops without committing them", error=repr(exc))
            raise

    async def _finish(self, items: list[Finished]) -> None:
        """History, latest results and review items first: a pair marked done is never scored
        again, so what it counts must exist by then. Then the done marks, settling tokens and
        keeping the judge verdicts the pairs paid for (the verdict cache) in passing - a verdict
        is kept only with the done mark of the rating that used it."""
        review = [taken for i in items for taken in i.review]
        # One id for the batch, whatever the outage guard replays: a replay after a connection
        # lost mid-pipeline adds no count, token or nano twice (each adding script checks it).
        batch = uuid.uuid4().hex
        cache = self._panel.verdict_cache

        async def write() -> None:
            await self._ratings.write([i.entry for i in items], [i.verdict for i in items if i.verdict is not None],
                                      batch=batch)
            if review:  # before the done marks, as the history: a pair done has its items
                for taken in await self._reviews.take(review, time.time()):
                    self._events.review_items(taken.project_id, taken.taken, taken.turned_away)
            await self.claims.mark_done([(i.claim, i.rating_id) for i in items],
                                        settled=[s for i in items for s in i.settled],
                                        saved=[(i.claim, i.saved.hits, i.saved.tokens) for i in items if i.saved.hits],
                                        batch=batch, paid=[(i.claim, p) for i in items for p in i.paid], cache=cache)

        await self._outages.call(write)

    # --- batched Redis calls ----------------------------------------------------------------------

    async def _confirm_many(self, claims: list[ClaimRequest]) -> list[bool]:
        return await self._outages.call(lambda: self.claims.confirm(claims))

    async def _reserve_one(self, reservation: Reservation) -> bool:
        (granted,) = await self._reserver.submit([reservation])
        return granted

    async def _reserve_many(self, reservations: list[Reservation]) -> list[bool]:
        return await self._outages.call(lambda: self.claims.reserve_many(reservations))
