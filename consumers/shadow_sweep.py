"""The shadow sweep: a shadow group past its ``shadowUntil`` leaves the catalog, and its unused candidate judge too.

``scoring.routing`` already skips it. The one rule: shared by the fleet, never a walk of the catalog -
only groups with live traffic in the last two days are looked at. The steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import structlog

from adapters.stores.catalog import CatalogStore, SnapshotCache, Write
from adapters.stores.client import RedisClient
from adapters.stores.ratings import RatingsStore
from consumers.fleet_share import FleetShare
from consumers.periodic import every
from scoring.catalog import CatalogSnapshot
from scoring.models import ScorerGroup

log = structlog.get_logger(__name__)

SWEEP_S = 60.0
ACTIVE_S = 2 * 86_400  # how far back the traffic read looks (the incident watcher's reach)


def expired(group: ScorerGroup | None, now: float) -> bool:
    online = group.online if group is not None else None
    return online is not None and online.shadow_of is not None and online.shadow_until is not None \
        and online.shadow_until.timestamp() <= now


class ShadowSweep:
    def __init__(self, *, redis: RedisClient, ratings: RatingsStore, catalog: Callable[[], CatalogSnapshot],
                 share: FleetShare, clock: Callable[[], float] = time.time) -> None:
        self._redis, self._ratings, self._catalog, self._share, self._clock = redis, ratings, catalog, share, clock

    async def run(self, stop: asyncio.Event) -> None:
        await every(SWEEP_S, self.tick, stop, name="the shadow sweep")

    async def tick(self) -> None:
        now = self._clock()
        active = await self._ratings.active(self._share.shards, now - ACTIVE_S, now)  # 1.
        snapshot = self._catalog()
        gone = [g for g in active if expired(snapshot.groups.get(g), now)]
        if gone:  # 2. against the worker's snapshot and the changes since it: never a whole read
            cache = SnapshotCache()
            cache.current = snapshot
            store = CatalogStore(self._redis, actor="shadow sweep", cache=cache)
            await store.write(lambda catalog: _removals(catalog, gone, now))
            log.info("expired shadows removed", groups=len(gone))


def _removals(catalog: CatalogSnapshot, candidates: list[str], now: float) -> list[Write]:
    gone = [g for g in candidates if expired(catalog.groups.get(g), now)]
    writes: list[Write] = [("groups", g, None) for g in gone]
    judges = {m.ref_id for g in gone for m in catalog.groups[g].members if m.kind == "judge"}
    projects = {catalog.groups[g].project_id for g in gone}
    # A candidate judge (named "sh-...") goes with the last group of its project that names it.
    still_used = {m.ref_id for p in projects for key in catalog.index.groups_by_project.get(p, ())
                  if key not in gone for m in catalog.groups[key].members if m.kind == "judge"}
    writes += [("judges", j, None) for j in sorted(judges - still_used) if j.startswith("sh-") and j in catalog.judges]
    return writes
