"""The catalog and the scorer-groups surface on the real Redis: every rule of the spec's
"SDK surface" section."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.stores.catalog import CatalogWatcher
from scoring.errors import InvalidDocument, NotFound
from scoring.models import Judge, Pattern
from services.groups import MonitorClient
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"  # a Standard Webhooks channel secret
FULL_ONLINE = {"enabled": True, "sampleRate": 0.2, "alertThreshold": 6, "severity": "high"}


@pytest.fixture
async def client(redis_db_url: str) -> AsyncIterator[MonitorClient]:
    redis = connect(redis_db_url)
    c = MonitorClient(redis)
    await c.scorers.put(Judge.model_validate({"id": "quality", "name": "Quality", "criteria": "Helpful?"}))
    await c.scorers.put(Judge.model_validate({"id": "safety", "name": "Safety", "criteria": "Safe?"}))
    await c.scorers.put(Judge.model_validate({"id": "exact", "name": "Exact", "criteria": "Matches?",
                                              "requiresExpected": True}))
    await c.scorers.put(Pattern.model_validate({"id": "pii", "name": "PII", "polarity": "failure",
                                                "template": "email"}))
    yield c


def member(kind: str, ref: str, weight: float = 1, gate: bool = False) -> dict[str, Any]:
    return {"kind": kind, "refId": ref, "weight": weight, "gate": gate}


async def test_create_get_list_delete(client: MonitorClient) -> None:
    g = await client.scorer_groups.create(
        "Release quality bar", [member("judge", "quality"), member("judge", "safety", gate=True),
                                member("pattern", "pii", weight=0, gate=True)],
        description="ship gate", project_id="p-1")
    assert (await client.scorer_groups.get(g.id)) == g
    assert [x.id for x in await client.scorer_groups.list()] == [g.id]
    assert await client.scorer_groups.list(project_id="other") == []
    await client.scorer_groups.delete(g.id)
    with pytest.raises(NotFound) as info:
        await client.scorer_groups.get(g.id)
    assert info.value.status == 404


async def test_unknown_ref_is_a_400_naming_the_member(client: MonitorClient) -> None:
    with pytest.raises(InvalidDocument) as info:
        await client.scorer_groups.create("G", [member("judge", "quality"), member("judge", "nope")],
                                          project_id="p-1")
    assert info.value.status == 400
    assert info.value.errors == ["members[1].refId: no LLM judge with id 'nope'"]
    assert await client.scorer_groups.list() == []


async def test_save_time_limits_are_400s(client: MonitorClient) -> None:
    with pytest.raises(InvalidDocument, match=r"members\[0\].weight: Input should be less than or equal to 1000"):
        await client.scorer_groups.create("G", [member("judge", "quality", weight=1001)], project_id="p")
    with pytest.raises(InvalidDocument, match=r"online\.sampleRate"):
        await client.scorer_groups.create("G", [member("judge", "quality")], project_id="p",
                                          online={**FULL_ONLINE, "sampleRate": 1.0000001})


async def test_update_is_sparse_and_online_merges_key_by_key(client: MonitorClient) -> None:
    g = await client.scorer_groups.create("G", [member("judge", "quality")], project_id="p-1",
                                          online={**FULL_ONLINE, "scope": "session", "idleSeconds": 300})
    g2 = await client.scorer_groups.update(g.id, online={"sampleRate": 0.5, "severity": "critical"})
    assert g2.name == "G" and g2.members == g.members, "omitted fields keep their values"
    assert g2.online is not None
    assert (g2.online.sample_rate, g2.online.severity) == (0.5, "critical")
    assert (g2.online.scope, g2.online.idle_seconds, g2.online.alert_threshold) == ("session", 300, 6)
    g3 = await client.scorer_groups.update(g.id, online={"scope": "trace"})
    assert g3.online is not None and g3.online.scope == "trace", "send scope: trace to flip back"
    assert (await client.scorer_groups.get(g.id)) == g3


async def test_partial_online_patch_without_a_profile_is_a_400(client: MonitorClient) -> None:
    g = await client.scorer_groups.create("G", [member("judge", "quality")], project_id="p-1")
    with pytest.raises(InvalidDocument) as info:
        await client.scorer_groups.update(g.id, online={"sampleRate": 0.5})
    assert info.value.status == 400
    message = str(info.value)
    assert "send a full online object (enabled, sampleRate, alertThreshold, severity" in message
    assert 'scope defaults to "trace"' in message
    assert "missing: enabled, alertThreshold, severity" in message
    assert (await client.scorer_groups.get(g.id)).online is None, "nothing was invented"
    g2 = await client.scorer_groups.update(g.id, online=FULL_ONLINE)
    assert g2.online is not None and g2.online.scope == "trace" and g2.online.idle_seconds == 120


async def test_online_none_detaches_live_scoring(client: MonitorClient) -> None:
    g = await client.scorer_groups.create("G", [member("judge", "quality")], project_id="p-1",
                                          online=FULL_ONLINE)
    assert g.live
    g2 = await client.scorer_groups.update(g.id, online=None)
    assert g2.online is None and not g2.live
    snapshot = await client.store.snapshot()
    assert snapshot.live_groups("p-1", "trace") == ()


async def test_deleted_refs_are_grandfathered_new_unknown_refs_are_not(client: MonitorClient) -> None:
    g = await client.scorer_groups.create("G", [member("judge", "quality"), member("pattern", "pii", 0, True)],
                                          project_id="p-1")
    await client.scorers.delete("patterns", "pii")
    g2 = await client.scorer_groups.update(g.id, name="Renamed")
    assert g2.name == "Renamed" and g2.members[1].ref_id == "pii", "the stored ref is kept"
    with pytest.raises(InvalidDocument, match=r"members\[2\].refId: no LLM judge with id 'gone'"):
        await client.scorer_groups.update(g.id, members=[*g2.members, member("judge", "gone")])


async def test_requires_expected_refused_from_live_groups_at_create(client: MonitorClient) -> None:
    with pytest.raises(InvalidDocument, match="judge 'Exact' has requiresExpected and cannot grade live"):
        await client.scorer_groups.create("G", [member("judge", "exact")], project_id="p", online=FULL_ONLINE)
    # Allowed while live scoring is off, or with a disabled profile.
    await client.scorer_groups.create("Offline", [member("judge", "exact")], project_id="p")
    await client.scorer_groups.create("Disabled", [member("judge", "exact")], project_id="p",
                                      online={**FULL_ONLINE, "enabled": False})


async def test_requires_expected_refused_when_update_enables_live(client: MonitorClient) -> None:
    g = await client.scorer_groups.create("G", [member("judge", "exact")], project_id="p",
                                          online={**FULL_ONLINE, "enabled": False})
    with pytest.raises(InvalidDocument, match="requiresExpected"):
        await client.scorer_groups.update(g.id, online={"enabled": True})
    g2 = await client.scorer_groups.create("H", [member("judge", "quality")], project_id="p", online=FULL_ONLINE)
    with pytest.raises(InvalidDocument, match="requiresExpected"):
        await client.scorer_groups.update(g2.id, members=[member("judge", "exact")])


async def test_requires_expected_refused_when_a_live_groups_judge_changes(client: MonitorClient) -> None:
    await client.scorer_groups.create("Live", [member("judge", "quality")], project_id="p", online=FULL_ONLINE)
    with pytest.raises(InvalidDocument) as info:
        await client.scorers.put(Judge.model_validate({"id": "quality", "name": "Quality",
                                                       "criteria": "Helpful?", "requiresExpected": True}))
    assert "requiresExpected: judge 'Quality' is a member of group 'Live'" in str(info.value)
    assert not (await client.store.snapshot()).judges["quality"].requires_expected


async def test_two_concurrent_updates_of_one_group_lose_nothing(redis_db_url: str, client: MonitorClient) -> None:
    g = await client.scorer_groups.create("G", [member("judge", "quality")], project_id="p-1",
                                          online=FULL_ONLINE)
    # Separate connections, so the writers really race on the server.
    writers = [MonitorClient(connect(redis_db_url)) for _ in range(4)]
    await asyncio.gather(
        writers[0].scorer_groups.update(g.id, description="new description"),
        writers[1].scorer_groups.update(g.id, online={"sampleRate": 0.9}),
        writers[2].scorer_groups.update(g.id, online={"severity": "low"}),
        writers[3].scorer_groups.update(g.id, name="New name"),
    )
    final = await client.scorer_groups.get(g.id)
    assert final.description == "new description" and final.name == "New name"
    assert final.online is not None
    assert (final.online.sample_rate, final.online.severity) == (0.9, "low")
    for w in writers:
        await w.store.redis.aclose()


async def test_running_watcher_sees_a_change(client: MonitorClient) -> None:
    watcher = CatalogWatcher(client.store)
    await watcher.start()
    try:
        before = watcher.current
        assert before.groups == {}
        g = await client.scorer_groups.create("G", [member("judge", "quality")], project_id="p-1",
                                              online=FULL_ONLINE)
        deadline = time.monotonic() + 30
        while g.id not in watcher.current.groups:
            assert time.monotonic() < deadline, "the change never arrived"
            await asyncio.sleep(0.01)
        assert watcher.current.live_groups("p-1", "trace") == (g,)
        assert before.groups == {}, "the old snapshot was swapped, never mutated"
    finally:
        await watcher.stop()


async def test_apply_is_idempotent_and_reports(client: MonitorClient) -> None:
    doc = {
        "judges": [{"id": "tone", "name": "Tone", "criteria": "Polite?"}],
        "patterns": [{"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology"}],
        "groups": [{"id": "support", "name": "Support", "projectId": "p-1",
                    "members": [member("judge", "tone"), member("pattern", "apology", 0, True)],
                    "online": FULL_ONLINE}],
        "budgets": [{"projectId": "p-1", "judgeCallsPerWindow": 100, "windowSeconds": 3600}],
        "channels": [{"agentId": "a-1", "url": "https://hooks.example.com/x", "secret": SECRET}],
    }
    first = await client.apply(doc)
    assert sorted(first.created) == ["budgets/p-1", "channels/a-1|https://hooks.example.com/x",
                                     "groups/support", "judges/tone", "patterns/apology"]
    second = await client.apply(doc)
    assert second.changes == 0 and len(second.unchanged) == 5
    doc["judges"][0]["criteria"] = "Polite and warm?"
    third = await client.apply(doc)
    assert third.changed == ["judges/tone"] and third.created == []
    snapshot = await client.store.snapshot()
    secret = snapshot.channels_for("a-1")[0].secret
    assert secret is not None and secret.get_secret_value() == SECRET, "secrets are stored, not masked"


async def test_a_bad_file_is_refused_whole_with_every_error(client: MonitorClient) -> None:
    before = await client.store.version()
    bad = {"judges": [{"id": "new", "name": "New", "criteria": "x"}],
           "groups": [{"id": "g1", "name": "G1", "projectId": "p", "members": [member("judge", "missing")]},
                      {"id": "g2", "name": "G2", "projectId": "p", "members": [member("judge", "exact")],
                       "online": FULL_ONLINE}]}
    with pytest.raises(InvalidDocument) as info:
        await client.apply(bad)
    assert info.value.errors == [
        "groups[0] 'g1': members[0].refId: no LLM judge with id 'missing'",
        "groups[1] 'g2': members[0].refId: judge 'Exact' has requiresExpected and cannot grade live traffic; "
        "disable requiresExpected or keep the group's live scoring off"]
    assert await client.store.version() == before, "nothing half-applied"
    with pytest.raises(InvalidDocument) as info:
        await client.apply({"groups": [{"id": "g", "name": "", "members": []}]})
    assert len(info.value.errors) == 3  # name too short, projectId missing, members empty


async def test_a_catalog_file_refuses_a_bad_filter_naming_its_path(client: MonitorClient) -> None:
    before = await client.store.version()
    leaf = {"field": "agentId", "op": "eq", "value": "a"}
    bad = {"groups": [{"id": "f1", "name": "F1", "projectId": "p", "members": [member("judge", "exact")],
                       "online": {**FULL_ONLINE, "filter": {"all": [leaf, {**leaf, "op": "like"}]}}},
                      {"id": "f2", "name": "F2", "projectId": "p", "members": [member("judge", "tone")],
                       "online": {**FULL_ONLINE, "filter": {"field": "root.output", "op": "matches",
                                                             "value": "(?<=no)lookbehind"}}}]}
    with pytest.raises(InvalidDocument) as info:
        await client.apply(bad)
    assert any(e.startswith("groups[0] 'f1': online.filter.all[1].op: must be one of eq") for e in info.value.errors)
    assert any(e.startswith("groups[1] 'f2': online.filter.value: regex is not supported") for e in info.value.errors)
    assert await client.store.version() == before, "nothing half-applied"
