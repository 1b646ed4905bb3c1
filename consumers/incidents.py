"""The incident watcher: every worker watches the groups of its share of the fleet's background work.

Judging is ``scoring.incidents``'s; this loop reads the windows, moves the watches and publishes. The one
rule: a watch moves once per fleet (the store moves it only from the version this worker read), and an
event moved but not acknowledged is published again, with the same ids, before the watch moves on.
The tick's steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
import structlog

from adapters.stores.incidents import PENDING_S, IncidentStore, bucket_size
from adapters.stores.ratings import RatingsStore
from adapters.stores.review_items import ReviewItems
from consumers.fleet_share import FleetShare
from consumers.label_windows import LabelledRow, LabelWindows
from consumers.periodic import Send, every
from scorer_groups.documents import IncidentReason
from scoring.catalog import CatalogSnapshot
from scoring.incidents import (
    Baseline,
    JudgeAgreement,
    Transition,
    Watch,
    WindowStats,
    agreement_verdict,
    describe,
    incident_deliveries,
    incident_id,
    incident_signal,
    reasons,
    step,
    unwatched_signal,
    verdict,
)
from scoring.models import AlertChannel, ScorerGroup
from scoring.outbox import Record, TopicNames
from scoring.results import channel_key
from scoring.review_agreement import judge_agreements

log = structlog.get_logger(__name__)

CATCH_UP_WINDOWS = 24  # closed windows learned in one tick after the fleet was away; older ones pass
MAX_WINDOW_S = 2 * 86_400  # two of the longest alertWindowSeconds: older traffic matters to no watch

class IncidentEvents(Protocol):
    def incident_open(self, project_id: str, group_id: str, reason: str, is_open: bool) -> None: ...

    def judge_agreement(self, project_id: str, group_id: str, judge: str, spearman: float | None,
                        items: int) -> None: ...


class _Silent:
    def incident_open(self, project_id: str, group_id: str, reason: str, is_open: bool) -> None:
        pass

    def judge_agreement(self, project_id: str, group_id: str, judge: str, spearman: float | None,
                        items: int) -> None:
        pass


def _watched(group: ScorerGroup | None, reason: str | None = None) -> bool:
    """Is the group watched (for ``reason``): live, and alerting on its level for it?"""
    if group is None or group.online is None or not group.online.enabled or group.online.shadow_of is not None:
        return False  # (a shadow pages no one)
    watched = reasons(group.online)
    return bool(watched) if reason is None else reason in watched


class IncidentWatcher:
    def __init__(self, *, store: IncidentStore, ratings: RatingsStore, catalog: Callable[[], CatalogSnapshot],
                 send: Send, topics: TopicNames, events: IncidentEvents | None = None, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.time, share: FleetShare | None = None,
                 reviews: ReviewItems | None = None) -> None:
        self._store, self._ratings, self._catalog = store, ratings, catalog
        self._send, self._topics, self._events = send, topics, events or _Silent()
        self._interval_s, self._clock = interval_s, clock
        self._share = share or FleetShare.everything()
        self._said_open: set[tuple[str, str, str]] = set()  # (project, group, reason) exported open
        self._labels = LabelWindows(reviews, self._share) if reviews is not None else None
        self._said_agreement: set[tuple[str, str, str]] = set()  # (project, group, judge) exported

    async def run(self, stop: asyncio.Event) -> None:
        await every(self._interval_s, self.tick, stop, name="the incident watch")

    async def tick(self) -> None:
        snapshot, now = self._catalog(), self._clock()
        try:  # what is open, and which of this worker's groups had live traffic (one round trip each)
            open_watches = await self._store.open_watches()
            active = await self._ratings.active(self._share.shards, now - MAX_WINDOW_S, now)
        except Exception:
            log.exception("reading the incident watches failed; trying again on the next tick")
            return
        open_groups = {group_id for group_id, _ in open_watches}
        windows = await self._agreements(snapshot)
        for project_id, group_id, reason in list(self._said_open):  # handed to another worker: its word now
            if not self._share.owns(group_id):
                self._export(project_id, group_id, reason, False)
        # Only what had live traffic or has an incident open: a group without live traffic in its
        # last two windows (the one to judge, the one closed before it: drift learns it) and
        # without an incident open has nothing to judge, and is never even looked at (idle
        # groups are most of a large catalog; walking them held the loop).
        for group_id in sorted(active.keys() | windows.keys() | {g for g in open_groups if self._share.owns(g)}):
            group = snapshot.groups.get(group_id)
            if group is None or not _watched(group):
                continue
            assert group.online is not None
            if (group_id not in open_groups and not (group_id in windows and _watched(group, "agreement"))
                    and active.get(group_id, -1.0) < now - 2 * group.online.alert_window_seconds):
                continue
            try:
                await self._watch(group, snapshot, self._clock(), windows.get(group_id, []))
            except Exception:  # one group's watch is lost this tick; the others go on
                log.exception("an incident watch failed; trying again on the next tick", group=group.id)
        try:  # 5.
            unwatched = [(g, r) for g, r in open_watches
                         if self._share.owns(g) and not _watched(snapshot.groups.get(g), r)]
            for group_id, reason in unwatched:
                await self._close(group_id, reason, snapshot, self._clock())  # type: ignore[arg-type]
        except Exception:
            log.exception("closing unwatched incidents failed; trying again on the next tick")

    async def _agreements(self, snapshot: CatalogSnapshot) -> dict[str, list[LabelledRow]]:
        """The windows of labels of this worker's groups, and each judge's agreement exported."""
        if self._labels is None:
            return {}
        try:
            windows = await self._labels.read(snapshot)
        except Exception:
            log.exception("reading the review labels failed; trying again on the next tick")
            return {}
        said = set()
        for group_id, rows in windows.items():
            group = snapshot.groups[group_id]
            for judge in judge_agreements(group, [(card, labels) for _, card, labels in rows]):
                self._events.judge_agreement(group.project_id, group.id, judge.ref_id, judge.spearman, judge.items)
                said.add((group.project_id, group.id, judge.ref_id))
        for project_id, group_id, judge_id in self._said_agreement - said:  # gone, or another worker's now
            self._events.judge_agreement(project_id, group_id, judge_id, None, 0)
        self._said_agreement = said
        return windows

    async def _watch(self, group: ScorerGroup, snapshot: CatalogSnapshot, now: float,
                     labelled: list[LabelledRow]) -> None:
        profile = group.online
        assert profile is not None
        window_s = profile.alert_window_seconds
        stats = await self._store.window(group.id, now - window_s, now, now)  # 1.
        watched = reasons(profile)
        states = {reason: await self._store.watch_with_channels(group.id, reason) for reason in watched}
        level = None
        if "drift" in watched:  # 2.
            level = await self._learned(group, now, window_s, drifting=states["drift"][0].incident_id is not None)
        for reason, (watch, pending, kept) in states.items():  # 3.
            if pending is not None:
                if now - float(pending["movedAt"]) <= PENDING_S:
                    continue  # its mover is publishing it; the watch moves after
                await self._publish(pending)
                await self._store.published(group.id, reason, watch.version)
            judges: list[JudgeAgreement] = []
            if reason == "agreement":  # over the items labelled since the watch last moved
                judges = judge_agreements(group, [(card, labels) for at, card, labels in labelled
                                                  if watch.since is None or at > watch.since])
                judged = agreement_verdict(profile, judges)
            else:
                judged = verdict(reason, profile, stats, level)
            moved = step(watch, judged, now, 0 if reason == "agreement" else window_s,
                         incident_id(group.id, reason, watch.version))
            if moved is not None:
                await self._moved(group, snapshot, reason, watch, kept, moved, stats, level, window_s, now, judges)
                watch = moved.watch
            self._export(group.project_id, group.id, reason, watch.incident_id is not None)  # 4.

    async def _learned(self, group: ScorerGroup, now: float, window_s: int, drifting: bool) -> Baseline:
        level = await self._store.level(group.id)
        last_closed = int(now // window_s) - 1
        if last_closed <= level.last_window:
            return level
        if drifting:  # passed, not learned - nor learned later, once the incident resolves
            passed = Baseline(level.mean, level.variance, level.learned, last_closed)
            await self._store.learn(group.id, passed)
            return passed
        # A new level starts from the last closed window; a known one learns every window since
        # its last, so a fleet that was away (or a tick later than a window) misses none of them.
        first = last_closed if level.last_window < 0 else max(level.last_window + 1,
                                                              last_closed - CATCH_UP_WINDOWS + 1)
        learned = level
        for window in range(first, last_closed + 1):
            start = window * window_s
            # Passed: a window the history no longer holds in buckets as fine as the window (its
            # minutes are gone after an hour, its quarters after a day), or one without results.
            closed = (await self._store.window(group.id, start, start + window_s - 1, now)
                      if bucket_size(now - start) <= window_s else None)
            learned = (learned.learn(window, closed.mean, window_s) if closed is not None and closed.mean is not None
                       else Baseline(learned.mean, learned.variance, learned.learned, window))
        await self._store.learn(group.id, learned)
        return learned

    async def _moved(self, group: ScorerGroup, snapshot: CatalogSnapshot, reason: IncidentReason, read: Watch,
                     kept: list[list[str]], moved: Transition, stats: WindowStats, level: Baseline | None,
                     window_s: int, now: float, judges: list[JudgeAgreement]) -> None:
        profile = group.online
        assert profile is not None
        agents = await self._agents(group.id, now - window_s)
        justification = describe(reason, moved.state, profile, stats, level, window_s, judges)
        signal = incident_signal(group, reason, moved, stats, agents[0] if agents else "", justification)
        if moved.state == "opened":
            channels = [c for agent in agents for c in snapshot.channels_for(agent, group.project_id)]
            if not channels:  # no result to name an agent (a budget run dry): the project's channels
                channels = [c for c in snapshot.channels.values() if c.project_id == group.project_id]
        else:
            channels = self._kept_channels(snapshot, group.project_id, kept)
        channels = [c for c in dict.fromkeys(channels) if not c.disabled]
        event = {"signal": orjson.loads(signal.to_json()),
                 "deliveries": [orjson.loads(d.to_json()) for d in incident_deliveries(signal, channels)]}
        at = datetime.fromtimestamp(moved.at, UTC).isoformat()
        first = datetime.fromtimestamp(read.opened_at if read.opened_at is not None else moved.at, UTC).isoformat()
        record = {"id": moved.incident_id, "groupId": group.id, "projectId": group.project_id, "reason": reason,
                  "state": "open" if moved.state == "opened" else "resolved", "openedAt": first,
                  "resolvedAt": at if moved.state == "resolved" else None, "lastSaid": justification,
                  "windowMean": stats.mean, "windowResults": stats.results, "groupName": group.name,
                  "severity": profile.severity, "scope": profile.scope, "alertThreshold": profile.alert_threshold}
        paged = [[c.agent_id, channel_key(c.url)] for c in channels]
        if not await self._store.move(group.id, reason, read, moved.watch, event, record, paged, now=now):
            return  # another worker moved it first: it publishes
        log.info(f"incident {moved.state}", group=group.id, reason=reason, incident=moved.incident_id)
        await self._publish(event)
        await self._store.published(group.id, reason, moved.watch.version)

    @staticmethod
    def _kept_channels(snapshot: CatalogSnapshot, project_id: str, kept: list[list[str]]) -> list[AlertChannel]:
        """The channels an opening paged, as the catalog has them now (a removed one is not)."""
        wanted = {(agent, key) for agent, key in kept}
        return [c for c in snapshot.channels.values() if (c.agent_id, channel_key(c.url)) in wanted
                and c.project_id in (None, project_id)]

    async def _close(self, group_id: str, reason: IncidentReason, snapshot: CatalogSnapshot, now: float) -> None:
        """5: resolve the open incident of a watch no longer watched."""
        watch, pending, kept = await self._store.watch_with_channels(group_id, reason)
        if pending is not None:
            if now - float(pending["movedAt"]) <= PENDING_S:
                return
            await self._publish(pending)
            await self._store.published(group_id, reason, watch.version)
        record = await self._store.record(group_id, watch.incident_id) if watch.incident_id else None
        project = str((record or {}).get("projectId", ""))
        if watch.incident_id is not None:
            signal = unwatched_signal(group_id, reason, watch.incident_id, now, record or {})
            channels = [c for c in self._kept_channels(snapshot, project, kept) if not c.disabled]
            event = {"signal": orjson.loads(signal.to_json()),
                     "deliveries": [orjson.loads(d.to_json()) for d in incident_deliveries(signal, channels)]}
            resolved = {**(record or {"id": watch.incident_id, "groupId": group_id, "reason": reason}),
                        "state": "resolved", "resolvedAt": datetime.fromtimestamp(now, UTC).isoformat(),
                        "lastSaid": signal.justification}
            if not await self._store.move(group_id, reason, watch, Watch(version=watch.version + 1), event, resolved,
                                          now=now):
                return
            log.info("incident resolved: no longer watched", group=group_id, reason=reason, incident=watch.incident_id)
            await self._publish(event)
            await self._store.published(group_id, reason, watch.version + 1)
        else:  # resolved meanwhile: only the index still named it
            await self._store.forget_open(group_id, reason)
        self._export(project, group_id, reason, False)

    def _export(self, project_id: str, group_id: str, reason: str, is_open: bool) -> None:
        """4: this worker's word on a watch; what it said open is remembered, so that a watch
        handed to another worker (a shard moved) is no longer said open from here."""
        self._events.incident_open(project_id, group_id, reason, is_open)
        if is_open:
            self._said_open.add((project_id, group_id, reason))
        else:
            self._said_open.discard((project_id, group_id, reason))

    async def _agents(self, group_id: str, since: float) -> list[str]:
        """The agents of the group's results in the window, the busiest first: the channels an
        incident goes to are theirs."""
        documents, _ = await self._ratings.results(group_id, limit=200)
        seen: Counter[str] = Counter()
        for raw in documents:
            doc = orjson.loads(raw)
            if datetime.fromisoformat(doc["scoredAt"]).timestamp() >= since:
                seen[doc["agentId"]] += 1
        return [agent for agent, _ in seen.most_common()]

    async def _publish(self, event: dict[str, Any]) -> None:
        signal = event["signal"]
        records = [Record(self._topics.signals, signal["key"].encode(), orjson.dumps(signal))]
        records += [Record(self._topics.webhooks, d["agentId"].encode(), orjson.dumps(d)) for d in event["deliveries"]]
        await self._send(records)

