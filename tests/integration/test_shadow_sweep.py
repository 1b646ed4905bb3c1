"""The shadow sweep on real Redis: a shadow past its ``shadowUntil`` that scored leaves
the catalog with its candidate judge; a shadow still in its time stays, as does a judge another
group of the project still names, and the group the shadow ran beside; a worker whose share does
not hold the shadow leaves it to the one whose share does."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis

from adapters.stores.catalog import CatalogStore
from adapters.stores.ratings import RatingsStore
from consumers.fleet_share import FleetShare
from consumers.shadow_sweep import ShadowSweep
from scoring.models import Judge, ScorerGroup
from scoring.results import HistoryEntry

pytestmark = pytest.mark.integration


def a_group(group_id: str, judge: str, project: str, **online: Any) -> ScorerGroup:
    return ScorerGroup.model_validate({
        "id": group_id, "name": group_id, "projectId": project, "members": [{"kind": "judge", "refId": judge}],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high", **online}})


async def test_an_expired_shadow_that_scored_leaves_the_catalog_with_its_candidate(redis_db_client: Redis, unique: str) -> None:
    project = f"p-{unique}"
    past, later = datetime.now(UTC) - timedelta(minutes=5), datetime.now(UTC) + timedelta(hours=1)
    live = a_group(f"g-{unique}", f"j-{unique}", project)
    expired = a_group(f"sh-{unique}-0", f"sh-{unique}-judge", project, shadowOf=live.id, shadowUntil=past.isoformat())
    running = a_group(f"sh-{unique}b-0", f"sh-{unique}b-judge", project, shadowOf=live.id,
                      shadowUntil=later.isoformat())
    shared_candidate = a_group(f"sh-{unique}c-0", f"sh-{unique}c-judge", project, shadowOf=live.id,
                               shadowUntil=past.isoformat())
    keeps_it = a_group(f"g2-{unique}", f"sh-{unique}c-judge", project)  # a tenant's group naming it
    groups = [live, expired, running, shared_candidate, keeps_it]
    judges = {g.members[0].ref_id for g in groups}
    store = CatalogStore(redis_db_client)
    await store.write(lambda _: [*[("judges", j, Judge(id=j, name=j, criteria="?", project_id=project))
                                   for j in sorted(judges)], *[("groups", g.id, g) for g in groups]])
    now = time.time()
    await RatingsStore(redis_db_client).write([HistoryEntry(g.id, 5.0, False, now - 600) for g in groups])
    snapshot = await store.snapshot()

    elsewhere = FleetShare.everything()
    elsewhere.shards = frozenset()  # another worker's share: none of these groups
    await ShadowSweep(redis=redis_db_client, ratings=RatingsStore(redis_db_client), catalog=lambda: snapshot, share=elsewhere).tick()
    assert set((await store.snapshot()).groups) >= {g.id for g in groups}, "not this worker's to sweep"

    await ShadowSweep(redis=redis_db_client, ratings=RatingsStore(redis_db_client), catalog=lambda: snapshot,
                      share=FleetShare.everything()).tick()
    after = await store.snapshot()
    assert {g.id for g in groups} - set(after.groups) == {expired.id, shared_candidate.id}
    assert judges - set(after.judges) == {f"sh-{unique}-judge"}, "a judge a group still names stays"
