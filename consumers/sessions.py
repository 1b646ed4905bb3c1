"""The session sweep: judge whole conversations once they go quiet.

Every worker runs a sweeper; claims keyed by the session and its turn count make each (session, turns,
group) judged once - a session that grew is judged again. The one rule: scoring follows the pair protocol
(``consumers.pair_protocol``); an outage is waited out (``consumers.outage``), any other failure costs one
sweep. The steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable

import structlog

from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from adapters.stores.sessions import QuietSession, SessionStore
from consumers.events import SILENT, PipelineEvents
from consumers.fleet_share import FleetShare
from consumers.loop import SLICE_S
from consumers.outage import OutageGuard, not_the_subjects_fault
from consumers.outputs import Outputs
from consumers.pair_protocol import Fate, PairProtocol
from consumers.pauses import PauseWatch
from consumers.periodic import every
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import day_of
from scoring.filters import TraceView
from scoring.models import ScorerGroup
from scoring.panel import Panel
from scoring.regex_work import RegexWork
from scoring.routing import Pair, pair_of
from scoring.sampling import keep
from scoring.subjects import Subject, session_subject

log = structlog.get_logger(__name__)

MIN_TURNS = 2
PAGE = 200  # quiet sessions read at once
MAX_PAGES = 25  # per project and sweep: the rest wait for the next tick
FULL_SWEEP_S = 300.0  # every project with session groups looked at, beside the index of open ones


class SessionSweeper:
    def __init__(self, *, store: SessionStore, outputs: Outputs, catalog: Callable[[], CatalogSnapshot],
                 panel: Panel, claims: Claims, ratings: RatingsStore, events: PipelineEvents | None = None,
                 interval_s: float = 2.0, concurrency: int = 16, pauses: PauseWatch | None = None,
                 outages: OutageGuard | None = None, share: FleetShare | None = None) -> None:
        self._store = store
        self._share = share or FleetShare.everything()  # the projects this worker sweeps
        self._catalog = catalog
        self._events: PipelineEvents = events or SILENT
        self._outages = outages or OutageGuard()
        self.pairs = PairProtocol(claims=claims, outputs=outputs, ratings=ratings, panel=panel, outages=self._outages,
                                  events=self._events, pauses=pauses, finish_batch=concurrency)
        self._interval_s = interval_s
        self._concurrency = concurrency
        self._full_at = 0.0  # when the next sweep looks at every project (monotonic): the first does

    async def run(self, stop: asyncio.Event) -> None:
        self.pairs.start()
        watching = asyncio.create_task(self.pairs.pauses.run(stop), name="sweep-pause-watch")
        try:
            await every(self._interval_s, self.sweep_once, stop, name="the session sweep")
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            await self.pairs.close(self._interval_s)

    async def sweep_once(self, now: float | None = None) -> int:
        """One sweep over the projects of this worker's share (``consumers.fleet_share``) with
        conversations open - or all of them with session groups, every ``FULL_SWEEP_S``; returns
        how many (session, group) pairs were judged."""
        now = time.time() if now is None else now
        snapshot = self._catalog()
        # The projects with live session-scope groups, from the snapshot's index (never a walk of
        # every group: at 50,000 it held the loop ~55 ms every sweep), of this worker's share.
        live = {p for p, scope in snapshot.index.live if scope == "session" and self._share.owns(p)}
        open_ = await self._outages.call(self._store.open_projects)
        full = time.monotonic() >= self._full_at
        if full:
            self._full_at = time.monotonic() + FULL_SWEEP_S
        judged = 0
        for project in sorted(live if full else live & open_.keys()):
            try:
                judged += await self._sweep_project(project, snapshot, now)
                await self._outages.call(functools.partial(self._store.reindex, project, open_.get(project)))
            except Exception as exc:
                if not_the_subjects_fault(exc):
                    raise  # the infrastructure's: the whole sweep waits for the next tick
                # One project's data must never stop the sweep of the others.
                log.exception("sweeping a project's sessions failed; the other projects go on", project=project)
        return judged

    async def _sweep_project(self, project: str, snapshot: CatalogSnapshot, now: float) -> int:
        groups = snapshot.live_groups(project, "session")
        idle = [g.online.idle_seconds for g in groups if g.online is not None]
        judged, offset = 0, 0
        for _ in range(MAX_PAGES):
            sessions = await self._outages.call(
                functools.partial(self._store.quiet, project, min(idle), now, offset=offset, limit=PAGE))
            due: list[Pair] = []
            poisoned: list[str] = []
            slice_ends = time.monotonic() + SLICE_S
            for session in sessions:
                if time.monotonic() > slice_ends:  # the loop is given back between sessions
                    await asyncio.sleep(0)
                    slice_ends = time.monotonic() + SLICE_S
                if len(session.turns) < MIN_TURNS:
                    continue
                try:  # everything read from the turns: whatever a tenant sent costs its session only
                    due += self._due_pairs(session, groups, snapshot, now)
                except Exception as exc:  # a turn no member can read: drop the session, not the sweep
                    log.warning("session cannot be assembled; dropped from the sweep", project=project,
                                session=session.session_id, error=repr(exc)[:300])
                    poisoned.append(session.session_id)
            unsettled: set[str] = set()
            # Claim only as much as is scored at once: a lease must not wait behind a long queue.
            for chunk in range(0, len(due), self._concurrency):
                judged += await self._judge(due[chunk:chunk + self._concurrency], snapshot, unsettled)
            # Out of the index: sessions quiet past every group's idle time whose every pair is
            # decided. One that another worker is still judging (or that failed) stays.
            settled = [s.session_id for s in sessions
                       if now - s.last_activity >= max(idle) and s.session_id not in unsettled]
            await self._outages.call(functools.partial(self._store.forget, project, settled,
                                                       not_after=now - max(idle)))
            await self._outages.call(  # back only if it grows
                functools.partial(self._store.forget, project, poisoned, not_after=now))
            settled += [p for p in poisoned if p not in settled]
            if len(sessions) < PAGE:
                break
            offset += len(sessions) - len(settled)  # the settled ones left the index
        return judged

    def _due_pairs(self, session: QuietSession, groups: tuple[ScorerGroup, ...], snapshot: CatalogSnapshot,
                   now: float) -> list[Pair]:
        """The session's pairs due now: for each group quiet long enough, its matching turns (each
        turn is filtered alone, like a trace), 2+ of them, kept by the stable sample."""
        work = RegexWork()  # a conversation's turns share one trace's matching time
        views = [TraceView(turn, work) for turn in session.turns]
        subjects: dict[tuple[int, ...], tuple[Subject, int]] = {}  # groups that match the same turns share one
        due = []
        for group in groups:
            assert group.online is not None
            if now - session.last_activity < group.online.idle_seconds:
                continue
            matching = tuple(i for i, view in enumerate(views) if snapshot.passes(group, view))
            if len(matching) < MIN_TURNS:
                continue
            if not keep(session.session_id, group.online.sample_rate, group.online.sample_salt or ""):
                continue
            if matching not in subjects:
                turns = [session.turns[i] for i in matching]
                subjects[matching] = (session_subject(turns), day_of(min(t.timestamp for t in turns).timestamp()))
            subject, day = subjects[matching]
            due.append(pair_of(group, subject, snapshot,
                               subject_key=f"session:{session.session_id}:{subject.turns}", day=day,
                               pricing=self.pairs.pricing))
        return due

    async def _judge(self, due: list[Pair], snapshot: CatalogSnapshot, unsettled: set[str]) -> int:
        """The pair protocol (``consumers.pair_protocol``) for a chunk of due pairs; how many were judged."""
        claimed_at = time.monotonic()
        mine = []
        for item, claim in zip(due, await self.pairs.claim(due, snapshot), strict=True):
            if claim.state == "claimed":
                self._events.kept(item.group.project_id, item.group.id)
                mine.append(item)
            elif claim.state == "busy":
                unsettled.add(item.subject.session_id or "")
        await self.pairs.counts.write()
        if not mine:
            return 0
        outcomes = await self.pairs.together(mine, snapshot, "session", claimed_at=claimed_at, lost="leave")
        judged = 0
        for item, outcome in zip(mine, outcomes, strict=True):
            if outcome.fate is Fate.PUBLISHED:
                judged += 1
            elif outcome.fate in (Fate.LEFT, Fate.BROKE):  # judged again by a later sweep
                unsettled.add(item.subject.session_id or "")
                if outcome.error is not None:
                    log.warning("a conversation broke scoring; it is judged again on a later sweep",
                                project=item.group.project_id, session=item.subject.session_id,
                                error=repr(outcome.error)[:300])
        await self.pairs.counts.write()
        log.info("sessions judged", pairs=judged)
        return judged
