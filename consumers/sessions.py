"""The session sweep: judge whole conversations once they go quiet.

Every ``interval_s``, for each project with live session-scope groups:

1. read the sessions quiet for at least the shortest ``idleSeconds`` of those groups, with
   their turns;
2. pick the (session, group) pairs due: 2+ turns, quiet for the group's ``idleSeconds``, kept by
   the stable per-conversation sample;
3. claim them in one round trip, keyed by the session *and its turn count*: a session already
   judged at this length is skipped, one that grew is judged again; judge calls are reserved
   from the same online budget as trace scoring;
4. score the claimed pairs on the whole transcript, publish (rating, Signal, webhook
   deliveries), then mark them done and record the verdicts (ratings history, session scores);
5. drop from the index the sessions quiet past every group's idle time.

Every worker runs a sweeper; the claims make sure each (session, turns, group) is judged once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable

import structlog
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from consumers.events import NoEvents, PipelineEvents
from consumers.outputs import Outputs
from scoring.catalog import CatalogSnapshot
from scoring.pairs import day_of
from scoring.panel import GroupResult, Panel
from scoring.ports import BudgetExhausted
from scoring.results import tokens_of
from scoring.routing import Pair, pair_of
from scoring.sampling import keep
from scoring.stores.claims import Claims, PairSpend
from scoring.stores.ratings import RatingsStore, SessionVerdict
from scoring.stores.sessions import SessionStore
from scoring.subjects import session_subject

log = structlog.get_logger(__name__)

MIN_TURNS = 2
PAGE = 200  # quiet sessions read at once
MAX_PAGES = 25  # per project and sweep: the rest wait for the next tick


class SessionSweeper:
    def __init__(self, *, store: SessionStore, outputs: Outputs, catalog: Callable[[], CatalogSnapshot],
                 panel: Panel, claims: Claims, ratings: RatingsStore, events: PipelineEvents | None = None,
                 interval_s: float = 2.0, concurrency: int = 16) -> None:
        self._store = store
        self._outputs = outputs
        self._catalog = catalog
        self._panel = panel
        self._claims = claims
        self._ratings = ratings
        self._events: PipelineEvents = events or NoEvents()
        self._interval_s = interval_s
        self._concurrency = concurrency

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.sweep_once()
            except Exception:  # Redis or Kafka hiccup: the next tick tries again
                log.exception("session sweep failed; retrying on the next tick")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._interval_s)

    async def sweep_once(self, now: float | None = None) -> int:
        """One sweep over every project; returns how many (session, group) pairs were judged."""
        now = time.time() if now is None else now
        snapshot = self._catalog()
        projects = sorted({g.project_id for g in snapshot.groups.values()
                           if g.live and g.online is not None and g.online.scope == "session"})
        judged = 0
        for project in projects:
            try:
                judged += await self._sweep_project(project, snapshot, now)
            except (RedisError, KafkaError):
                raise  # an outage: the whole sweep waits for the next tick
            except Exception:  # one project's data must never stop the sweep of the others
                log.exception("sweeping a project's sessions failed; the other projects go on", project=project)
        return judged

    async def _sweep_project(self, project: str, snapshot: CatalogSnapshot, now: float) -> int:
        groups = snapshot.live_groups(project, "session")
        idle = [g.online.idle_seconds for g in groups if g.online is not None]
        judged, offset = 0, 0
        for _ in range(MAX_PAGES):
            sessions = await self._store.quiet(project, min(idle), now, offset=offset, limit=PAGE)
            due: list[Pair] = []
            poisoned: list[str] = []
            for session in sessions:
                if len(session.turns) < MIN_TURNS:
                    continue
                try:  # everything read from the turns: whatever a tenant sent costs its session only
                    subject = session_subject(session.turns)
                    day = day_of(min(t.timestamp for t in session.turns).timestamp())
                except Exception as exc:  # a turn no member can read: drop the session, not the sweep
                    log.warning("session cannot be assembled; dropped from the sweep", project=project,
                                session=session.session_id, error=repr(exc)[:300])
                    poisoned.append(session.session_id)
                    continue
                quiet_for = now - session.last_activity
                for group in groups:
                    assert group.online is not None
                    if quiet_for < group.online.idle_seconds:
                        continue
                    if not keep(session.session_id, group.id, group.online.sample_rate):
                        continue
                    due.append(pair_of(group, subject, snapshot,
                                       subject_key=f"session:{session.session_id}:{subject.turns}", day=day))
            unsettled: set[str] = set()
            # Claim only as much as is scored at once: a lease must not wait behind a long queue.
            for chunk in range(0, len(due), self._concurrency):
                judged += await self._judge(due[chunk:chunk + self._concurrency], snapshot, unsettled)
            # Out of the index: sessions quiet past every group's idle time whose every pair is
            # decided. One that another worker is still judging (or that failed) stays.
            settled = [s.session_id for s in sessions
                       if now - s.last_activity >= max(idle) and s.session_id not in unsettled]
            await self._store.forget(project, settled, not_after=now - max(idle))
            await self._store.forget(project, poisoned, not_after=now)  # back only if it grows
            settled += [p for p in poisoned if p not in settled]
            if len(sessions) < PAGE:
                break
            offset += len(sessions) - len(settled)  # the settled ones left the index
        return judged

    async def _judge(self, due: list[Pair], snapshot: CatalogSnapshot, unsettled: set[str]) -> int:
        claims = await self._claims.claim_many([d.claim for d in due])
        mine = []
        starved: Counter[str] = Counter()  # skipped for budget, by group: shown in the ratings history
        for item, claim in zip(due, claims, strict=True):
            if claim.state == "claimed":
                self._events.kept(item.group.project_id, item.group.id)
                mine.append(item)
            elif claim.state == "busy":
                unsettled.add(item.subject.session_id or "")
            elif claim.state == "exhausted":
                self._events.group_skipped(item.group.project_id, item.group.id, "budget")
                log.warning("judge budget exhausted; session not judged", group=item.group.id,
                            session=item.subject.session_id)
                starved[item.group.id] += 1
        await self._ratings.record_skipped(dict(starved), time.time())
        starved.clear()
        if not mine:
            return 0
        try:
            spends = {id(i): self._claims.spend(i.claim) for i in mine}
            scored = await asyncio.gather(*(self._score(i, snapshot, spends[id(i)]) for i in mine))
            # A gates-first group whose judges found no room in the budget is skipped whole (its
            # claim now says so); the rest go on.
            for item, result in zip(mine, scored, strict=True):
                if result is None:
                    self._events.group_skipped(item.group.project_id, item.group.id, "budget")
                    starved[item.group.id] += 1
            results = [r for r in scored if r is not None]
            mine = [i for i, r in zip(mine, scored, strict=True) if r is not None]
            # Still ours? A sweep that stalled past its leases may have lost sessions to another
            # worker, which judged them since: those are left to it (and to the next sweep).
            held = await self._claims.confirm([i.claim for i in mine])
            unsettled.update(i.subject.session_id or "" for i, ours in zip(mine, held, strict=True) if not ours)
            kept = [(i, r) for i, r, ours in zip(mine, results, held, strict=True) if ours]
            mine = [i for i, _ in kept]
            published = await self._outputs.publish([r for _, r in kept], "session", snapshot)
            pairs = list(zip(mine, published, strict=True))
            verdicts = [SessionVerdict(p.rating.session_id or "", p.rating.group_id, p.rating.rating,
                                       p.rating.justification, p.rating.scored_at.timestamp()) for p in published]
            # History and verdicts first: a pair marked done is never judged again.
            await self._ratings.record([p.history_event(item.group) for item, p in pairs], verdicts)
            await self._claims.mark_done([(item.claim, p.rating.id) for item, p in pairs],
                                         tokens=[(item.claim, spends[id(item)].settlement(tokens_of(result)))
                                                 for item, result in kept])
        except BaseException:
            unsettled.update(item.subject.session_id or "" for item in mine)
            with contextlib.suppress(Exception):
                await self._claims.release([item.claim for item in mine])
            raise
        await self._ratings.record_skipped(dict(starved), time.time())
        log.info("sessions judged", pairs=len(mine))
        return len(mine)

    async def _score(self, item: Pair, snapshot: CatalogSnapshot, spend: PairSpend) -> GroupResult | None:
        try:
            return await self._panel.score(item.group, item.subject, snapshot, spend=spend)
        except BudgetExhausted:
            log.warning("judge budget exhausted after the gates passed; session not judged", group=item.group.id,
                        session=item.subject.session_id)
            return None
