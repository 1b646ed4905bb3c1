"""A group's incidents through the API, as a real process on the real Redis: the
alert settings are saved and merged key by key, refused at their field; the incidents the
watcher recorded are listed, open ones first; another project's group is a 404."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from adapters.stores.incidents import IncidentStore
from scoring.incidents import Watch
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

ONLINE = {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}


@pytest.fixture(scope="module")
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str, str, str]]:
    with redis_databases.lease() as url:
        keys = create_key(url, "--project", "p-a"), create_key(url, "--project", "p-b")
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield process, url, *keys
        finally:
            process.stop()


async def recorded(url: str, group_id: str, incident: str, state: str, opened: float,
                   reason: str = "window_below") -> None:
    redis = connect(url)
    try:
        record = {"id": incident, "groupId": group_id, "projectId": "p-a", "reason": reason, "state": state,
                  "openedAt": datetime.fromtimestamp(opened, UTC).isoformat(),
                  "resolvedAt": None if state == "open" else datetime.now(UTC).isoformat(),
                  "lastSaid": "Opened: a mean of 3.00/10.", "windowMean": 3.0, "windowResults": 10}
        version = 0 if state == "resolved" else 1  # (the old one recorded first)
        store = IncidentStore(redis)
        assert await store.move(group_id, reason, Watch(version=version), Watch(incident, opened, version + 1),  # type: ignore[arg-type]
                                {"signal": {}}, record)
        await store.published(group_id, reason, version + 1)  # type: ignore[arg-type]  # as the watcher does
    finally:
        await redis.aclose()


def test_alert_settings_are_saved_merged_and_refused_at_their_field(api: tuple[ApiProcess, str, str, str]) -> None:
    process, _, a_key, _ = api
    with process.client(a_key) as a:
        judge = a.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()
        group = a.post("/v1/scorer-groups", json={"name": "G", "members": [{"kind": "judge", "refId": judge["id"]}],
                                                  "online": {**ONLINE, "alertMode": "window"}}).json()
        assert group["online"]["alertMode"] == "window"
        merged = a.patch(f"/v1/scorer-groups/{group['id']}", json={"online": {"alertNoScoreRate": 0.3}}).json()
        assert (merged["online"]["alertMode"], merged["online"]["alertNoScoreRate"]) == ("window", 0.3)
        refused = a.patch(f"/v1/scorer-groups/{group['id']}", json={"online": {"alertResolveAbove": 2}})
        assert refused.status_code == 400
        assert [e["field"] for e in refused.json()["errors"]] == ["online.alertResolveAbove"], refused.json()


def test_a_groups_incidents_are_listed_open_first_and_only_to_its_project(
        api: tuple[ApiProcess, str, str, str]) -> None:
    process, url, a_key, b_key = api
    with process.client(a_key) as a, process.client(b_key) as b:
        judge = a.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()
        group = a.post("/v1/scorer-groups", json={"name": "G", "members": [{"kind": "judge", "refId": judge["id"]}],
                                                  "online": {**ONLINE, "alertMode": "window"}}).json()
        now = time.time()
        asyncio.run(recorded(url, group["id"], "inc-old", "resolved", now - 7200))
        asyncio.run(recorded(url, group["id"], "inc-new", "open", now - 60))
        listed = a.get(f"/v1/scorer-groups/{group['id']}/incidents")
        assert listed.status_code == 200, listed.text
        assert [(i["id"], i["state"]) for i in listed.json()["incidents"]] == [("inc-new", "open"),
                                                                               ("inc-old", "resolved")]
        assert listed.json()["level"] is None, "no window learned yet"
        assert b.get(f"/v1/scorer-groups/{group['id']}/incidents").status_code == 404
        asyncio.run(recorded(url, group["id"], "inc-older", "resolved", now - 9000, reason="coverage"))
        first = a.get(f"/v1/scorer-groups/{group['id']}/incidents", params={"limit": 2}).json()
        assert [i["id"] for i in first["incidents"]] == ["inc-new", "inc-old"] and first["nextCursor"]
        rest = a.get(f"/v1/scorer-groups/{group['id']}/incidents",
                     params={"limit": 2, "cursor": first["nextCursor"]}).json()
        assert [i["id"] for i in rest["incidents"]] == ["inc-older"] and rest["nextCursor"] is None
        refused = a.get(f"/v1/scorer-groups/{group['id']}/incidents", params={"cursor": "x"})
        assert refused.status_code == 400 and "cursor" in refused.text, refused.text
