"""A catalog change costs the changed document, on the real Redis: a reader that had the catalog
reads only what the log names since (its bytes), its snapshot equals the catalog read whole,
and it reads whole when the log cannot tell; a running watcher has a change within a second at
10,000 groups."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from adapters.stores import keys
from adapters.stores.catalog import CatalogStore, CatalogWatcher, SnapshotCache
from adapters.stores.client import RedisClient
from scoring.catalog import CatalogSnapshot
from services.groups import MonitorClient

pytestmark = pytest.mark.integration


def catalog(groups: int, projects: int = 50) -> dict[str, Any]:
    judges = [{"id": f"j-{p}", "name": "Q", "criteria": "Helpful?", "projectId": f"p-{p}"} for p in range(projects)]
    return {"judges": judges, "groups": [
        {"id": f"g-{i}", "name": f"G {i}", "projectId": f"p-{i % projects}",
         "members": [{"kind": "judge", "refId": f"j-{i % projects}", "weight": 1}],
         "online": {"enabled": True, "sampleRate": 0.5, "alertThreshold": 6, "severity": "high",
                    "filter": {"field": "metadata.env", "op": "eq", "value": "prod"}}}
        for i in range(groups)]}


async def mark(redis: RedisClient) -> int:
    """What the server will have sent once this mark's own replies are (INFO's answers)."""
    first = int((await redis.info("stats"))["total_net_output_bytes"])
    second = int((await redis.info("stats"))["total_net_output_bytes"])
    return 2 * second - first


async def sent_since(redis: RedisClient, since: int) -> int:
    return int((await redis.info("stats"))["total_net_output_bytes"]) - since  # this reply: counted later


def documents(snapshot: CatalogSnapshot) -> dict[str, Any]:
    return {kind: {k: d.stored() for k, d in getattr(snapshot, kind).items()}
            for kind in ("judges", "patterns", "customs", "groups", "budgets", "channels")}


async def test_a_reader_that_had_the_catalog_reads_only_what_changed(redis_db_client: RedisClient) -> None:
    await MonitorClient(redis_db_client).apply(catalog(2_000))
    reader = CatalogStore(redis_db_client, cache=SnapshotCache())
    first = await reader.snapshot()
    since = await mark(redis_db_client)
    await reader.snapshot()  # nothing changed: the script answers the version alone
    unchanged = await sent_since(redis_db_client, since)

    writer = MonitorClient(redis_db_client)
    await writer.scorer_groups.update("g-7", description="changed")
    await writer.scorer_groups.delete("g-8")
    since = await mark(redis_db_client)
    after = await reader.snapshot()
    delta = await sent_since(redis_db_client, since)
    since = await mark(redis_db_client)
    whole = await CatalogStore(redis_db_client).snapshot()
    full = await sent_since(redis_db_client, since)

    assert after.version == first.version + 2 == whole.version
    assert documents(after) == documents(whole)
    assert after.groups["g-7"].description == "changed" and "g-8" not in after.groups
    assert [g.id for g in after.live_groups("p-7", "trace")] == [g.id for g in whole.live_groups("p-7", "trace")]
    assert unchanged < 200 and delta < 5_000 < 500_000 < full, (unchanged, delta, full)


async def test_a_version_the_log_does_not_name_is_read_whole(redis_db_client: RedisClient) -> None:
    """A write that left no log entry (a version before this one, a hand-made change): the
    reader cannot trust a delta and reads the catalog whole."""
    await MonitorClient(redis_db_client).apply(catalog(50))
    reader = CatalogStore(redis_db_client, cache=SnapshotCache())
    await reader.snapshot()
    await redis_db_client.hset(keys.catalog_hash("groups"), "g-3", (await redis_db_client.hget(keys.catalog_hash("groups"), "g-4")) or b"")
    await redis_db_client.incr(keys.CATALOG_VERSION)
    after = await reader.snapshot()
    assert after.groups["g-3"].id == "g-4"  # what Redis holds, read whole
    assert documents(after) == documents(await CatalogStore(redis_db_client).snapshot())


async def test_a_running_watcher_has_a_change_within_a_second_at_ten_thousand_groups(redis_db_client: RedisClient) -> None:
    await MonitorClient(redis_db_client).apply(catalog(10_000, projects=1_000))
    watcher = CatalogWatcher(CatalogStore(redis_db_client))
    await watcher.start()
    try:
        assert len(watcher.current.groups) == 10_000
        await MonitorClient(redis_db_client).scorer_groups.update("g-42", online={"enabled": False})
        changed_at = time.monotonic()
        while not (watcher.current.groups["g-42"].online and not watcher.current.groups["g-42"].online.enabled):
            assert time.monotonic() - changed_at < 1.0, "the watcher did not have the change within a second"
            await asyncio.sleep(0.01)
        assert [g.id for g in watcher.current.live_groups("p-42", "trace")] == [
            f"g-{i}" for i in sorted(range(1042, 10_000, 1000), key=lambda i: f"g-{i}")]
    finally:
        await watcher.stop()
