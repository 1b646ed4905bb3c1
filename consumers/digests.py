"""The digest sender: a channel with ``digestSeconds`` hears a group's Signals of a period in one message.

Every worker runs one over its share of the fleet's background work; per group alerting per result: 1. the
last closed period, 2. claim it, 3. the results below the threshold (none: nothing is sent), 4. one
delivery, then the period is marked sent. The one rule: one worker sends a period; one whose sender died
is sent again under the same id. The rest: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import orjson
import structlog

from adapters.stores.digests import DigestStore
from adapters.stores.keys import RESULTS_KEPT
from adapters.stores.ratings import RatingsStore
from consumers.fleet_share import FleetShare
from consumers.periodic import Send, every
from scorer_groups.documents import DIGEST_EVENT
from scoring.catalog import CatalogSnapshot
from scoring.models import AlertChannel, ScorerGroup
from scoring.outbox import Record, TopicNames
from scoring.results import channel_key, delivery, digest_signal

log = structlog.get_logger(__name__)

MAX_PERIOD_S = 86_400  # the longest digestSeconds

class DigestSender:
    def __init__(self, *, digests: DigestStore, ratings: RatingsStore, catalog: Callable[[], CatalogSnapshot],
                 send: Send, topics: TopicNames, interval_s: float = 10.0,
                 clock: Callable[[], float] = time.time, share: FleetShare | None = None) -> None:
        self._digests, self._ratings, self._catalog = digests, ratings, catalog
        self._send, self._topics, self._interval_s, self._clock = send, topics, interval_s, clock
        self._share = share or FleetShare.everything()

    async def run(self, stop: asyncio.Event) -> None:
        await every(self._interval_s, self.tick, stop, name="the digests' tick")

    async def tick(self) -> None:
        snapshot = self._catalog()
        by_project: dict[str | None, list[AlertChannel]] = {}  # a project's channel never hears another's groups
        for channel in snapshot.channels.values():
            if channel.digest_seconds is not None and not channel.disabled:
                by_project.setdefault(channel.project_id, []).append(channel)
        if not by_project:
            return
        shared = by_project.get(None, [])
        now = self._clock()
        # Groups without live traffic since the longest period's last one began send nothing.
        try:
            active = await self._ratings.active(self._share.shards, now - 2 * MAX_PERIOD_S, now)
        except Exception:  # the next tick tries again
            log.exception("reading which groups had traffic failed; trying again on the next tick")
            return
        for group_id in sorted(active):  # this worker's groups with live traffic: never the whole catalog
            group = snapshot.groups.get(group_id)
            online = None if group is None else group.online
            if group is None or online is None or not online.enabled or online.alert_mode != "each" \
                    or online.alert_threshold is None:
                continue
            for channel in by_project.get(group.project_id, []) + shared:
                assert channel.digest_seconds is not None
                if active[group.id] < (now // channel.digest_seconds - 1) * channel.digest_seconds:
                    continue  # no live traffic since its last period began: nothing to send
                try:
                    await self._period(group, channel, self._clock())
                except Exception:  # this digest waits for the next tick; the others go on
                    log.exception("a digest failed; trying again on the next tick", group=group.id)

    async def _period(self, group: ScorerGroup, channel: AlertChannel, now: float) -> None:
        period_s = channel.digest_seconds
        assert period_s is not None and group.online is not None
        period = int(now // period_s) - 1  # 1.
        start, end = period * period_s, (period + 1) * period_s
        key = channel_key(channel.url)
        if await self._digests.settled(group.id, key, period):
            return  # (one whose sender died is claimed again below, once stale)
        below, complete = await self._below(group.id, channel.agent_id, start, end)  # 3.
        if not below or not await self._digests.claim(group.id, key, period):  # 2.
            return
        signal = digest_signal(group, channel.url, channel.agent_id, period, period_s, below, complete)
        sent = delivery(signal, channel.url, event=DIGEST_EVENT)  # 4.
        await self._send([Record(self._topics.webhooks, channel.agent_id.encode(), sent.to_json())])
        await self._digests.sent(group.id, key, period)

    async def _below(self, group_id: str, agent_id: str, start: float, end: float) -> tuple[list[dict[str, Any]], bool]:
        """The agent's results below the threshold scored in ``[start, end)``, and whether that
        is all of them (the latest results are a bounded record: RESULTS_KEPT)."""
        documents, _ = await self._ratings.results(group_id, limit=RESULTS_KEPT, below=True)
        found = []
        for raw in documents:
            doc = orjson.loads(raw)
            at = datetime.fromisoformat(doc["scoredAt"]).timestamp()
            if at < start:
                break  # newest first: the rest is older
            # A backfill's results page nobody unless its job asked (its Signals say so).
            if at < end and doc["agentId"] == agent_id and doc.get("rating") is not None \
                    and doc.get("origin") != "backfill":
                found.append(doc)
        kept, oldest = await self._ratings.oldest_kept(group_id)
        complete = kept < RESULTS_KEPT or (oldest is not None and
                                           datetime.fromisoformat(orjson.loads(oldest)["scoredAt"]).timestamp() < start)
        return found, complete
