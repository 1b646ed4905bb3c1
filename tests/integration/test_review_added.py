"""Results put in a review queue by hand (``POST /v1/review-queues/{id}/items``, the
console's results list), on the real API process and Redis: rating ids among a watched group's
latest results become items once, with the verdicts and - one call away - the judge calls the
results list keeps; attacked as another project, a reviewer key and a reused group id."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from adapters.stores.ratings import RatingsStore
from scoring.results import HistoryEntry
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

PROJECT = "p-added"


class Keys:
    def __init__(self, url: str) -> None:
        self.admin = create_key(url, "--project", PROJECT)
        self.ann = create_key(url, "--project", PROJECT, "--role", "reviewer", "--name", "ann")
        self.bob = create_key(url, "--project", PROJECT, "--role", "reviewer", "--name", "bob")
        self.other_admin = create_key(url, "--project", "p-elsewhere")


@pytest.fixture(scope="module")
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, Keys]]:
    with redis_databases.lease() as url:
        made = Keys(url)
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield process, made
        finally:
            process.stop()


def client(process: ApiProcess, key: str) -> httpx.Client:
    return httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def a_group(http: httpx.Client, name: str) -> tuple[str, str]:
    judge = http.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()["id"]
    group = http.post("/v1/scorer-groups", json={
        "name": name, "members": [{"kind": "judge", "refId": judge, "label": "Helpful"}],
        "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}}).json()["id"]
    return group, judge


def a_result(group: str, judge: str, n: int, project: str = PROJECT) -> HistoryEntry:
    """A published result as the worker keeps it among the group's latest, with its judge call."""
    at = time.time()
    rating = {"id": f"r-{n}", "groupId": group, "groupName": "Tone", "projectId": project, "agentId": "a",
              "scope": "trace", "traceId": f"t-{n}", "kind": f"scorer-group:{group}", "rating": 7.0, "reason": None,
              "justification": "fine", "scoredAt": datetime.fromtimestamp(at, UTC).isoformat(),
              "members": [{"kind": "judge", "refId": judge, "name": "Helpful", "weight": 1.0, "gate": False,
                           "status": "scored", "native": 7.0, "goodness": 0.7, "detail": "Helpful enough."}]}
    call = {"refId": judge, "member": "Helpful", "model": "gpt-test",
            "messages": [{"role": "user", "content": f"Question {n}? Answer {n}.", "length": 20}],
            "answer": '{"score": 7}', "answerLength": 12, "startedAt": rating["scoredAt"], "latencyMs": 12.0,
            "attempts": 1}
    return HistoryEntry(group, 7.0, False, at, orjson.dumps(rating), rating_id=f"r-{n}", calls=orjson.dumps([call]))


async def keep(process: ApiProcess, entries: list[HistoryEntry]) -> None:
    redis = aioredis.Redis.from_url(process.redis_url)
    try:
        await RatingsStore(redis).write(entries)
    finally:
        await redis.aclose()


async def test_results_added_by_hand_become_items_once_with_their_calls(api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        group, judge = a_group(admin, "Tone")
        queue: dict[str, Any] = admin.post("/v1/review-queues", json={
            "name": "By hand", "groupIds": [group], "rule": {"below": True}}).json()
        await keep(process, [a_result(group, judge, n) for n in range(3)])

        added = admin.post(f"/v1/review-queues/{queue['id']}/items", json={"ratingIds": ["r-0", "r-1", "r-9"]})
        assert added.status_code == 200, added.text
        assert added.json() == {"added": 2, "already": 0, "turnedAway": 0, "missing": ["r-9"]}
        again = admin.post(f"/v1/review-queues/{queue['id']}/items", json={"ratingIds": ["r-1", "r-2"]})
        assert again.json() == {"added": 1, "already": 1, "turnedAway": 0, "missing": []}
        page = admin.get(f"/v1/review-queues/{queue['id']}/items").json()
        assert [i["ratingId"] for i in page["items"]] == ["r-0", "r-1", "r-2"]
        assert {i["reason"] for i in page["items"]} == {"added"} and page["counts"]["open"] == 3
        first = page["items"][0]
        assert first["subject"] == {"scope": "trace", "traceId": "t-0", "sessionId": None, "spanId": None,
                                    "spanName": None, "input": "", "output": "", "transcript": ""}
        assert first["rating"]["members"][0]["detail"] == "Helpful enough."

    with client(process, keys.ann) as ann, client(process, keys.bob) as bob:
        held = ann.post(f"/v1/review-queues/{queue['id']}/next").json()["item"]
        calls = ann.get(f"/v1/review-items/{held['id']}/calls")
        assert calls.status_code == 200, calls.text
        assert [c["messages"][0]["content"] for c in calls.json()] == [f"Question {held['ratingId'][2:]}? "
                                                                       f"Answer {held['ratingId'][2:]}."]
        # Bob neither holds nor labelled it: not his to read.
        assert bob.get(f"/v1/review-items/{held['id']}/calls").status_code == 404
        # A reviewer key reviews; it does not fill queues.
        assert ann.post(f"/v1/review-queues/{queue['id']}/items", json={"ratingIds": ["r-2"]}).status_code == 403


async def test_adding_is_refused_for_groups_the_queue_does_not_watch_and_other_projects(
        api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin, client(process, keys.other_admin) as theirs:
        group, judge = a_group(admin, "Watched")
        other_group, _ = a_group(admin, "Not watched")
        two = admin.post("/v1/review-queues", json={"name": "Two", "groupIds": [group, other_group],
                                                   "rule": {"below": True}}).json()
        one = admin.post("/v1/review-queues", json={"name": "One", "groupIds": [group],
                                                   "rule": {"below": True}}).json()
        await keep(process, [a_result(group, judge, 0),
                             # The same group id's result of another project (an id reused): never this queue's.
                             a_result(group, judge, 1, project="p-elsewhere")])

        unnamed = admin.post(f"/v1/review-queues/{two['id']}/items", json={"ratingIds": ["r-0"]})
        assert unnamed.status_code == 400 and "groupId: required" in unnamed.text, unnamed.text
        unwatched = admin.post(f"/v1/review-queues/{one['id']}/items",
                               json={"ratingIds": ["r-0"], "groupId": other_group})
        assert unwatched.status_code == 400 and "groupId: the queue does not watch" in unwatched.text
        too_many = admin.post(f"/v1/review-queues/{one['id']}/items", json={"ratingIds": [f"r-{n}" for n in range(101)]})
        assert too_many.status_code == 400 and "ratingIds" in too_many.text, too_many.text
        reused = admin.post(f"/v1/review-queues/{one['id']}/items", json={"ratingIds": ["r-0", "r-1"]})
        assert reused.json() == {"added": 1, "already": 0, "turnedAway": 0, "missing": ["r-1"]}
        assert theirs.post(f"/v1/review-queues/{one['id']}/items", json={"ratingIds": ["r-0"]}).status_code == 404


async def test_a_full_queue_turns_added_results_away_and_counts_them(api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        group, judge = a_group(admin, "Full")
        queue = admin.post("/v1/review-queues", json={"name": "Small", "groupIds": [group], "rule": {"below": True},
                                                     "capacity": 2}).json()
        await keep(process, [a_result(group, judge, n) for n in range(4)])
        added = admin.post(f"/v1/review-queues/{queue['id']}/items", json={"ratingIds": ["r-0", "r-1", "r-2", "r-3"]})
        assert added.json() == {"added": 2, "already": 0, "turnedAway": 2, "missing": []}
        counts = admin.get(f"/v1/review-queues/{queue['id']}/items").json()["counts"]
        assert (counts["open"], counts["turnedAway"]) == (2, 2)
