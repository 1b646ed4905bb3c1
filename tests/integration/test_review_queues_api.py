"""``/v1/review-queues`` on the real API process and Redis: a queue is a catalog document
of its project - created with its defaults, refused with the field that is wrong, merged by a
PATCH as a group's online profile is, invisible to other projects, and in every worker's snapshot
under the groups it watches."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from adapters.stores import keys
from adapters.stores.catalog import CatalogStore
from adapters.stores.review_items import ReviewItems
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str, str]]:
    with redis_databases.lease() as url:
        mine, other = create_key(url, "--project", "p-rev"), create_key(url, "--project", "p-other")
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield process, mine, other
        finally:
            process.stop()


def client(process: ApiProcess, key: str) -> httpx.Client:
    return httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def a_group(http: httpx.Client, name: str) -> str:
    judge = http.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"})
    assert judge.status_code == 201, judge.text
    made = http.post("/v1/scorer-groups", json={
        "name": name, "members": [{"kind": "judge", "refId": judge.json()["id"]}],
        "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def test_a_queue_is_created_read_listed_merged_and_deleted(api: tuple[ApiProcess, str, str]) -> None:
    process, mine, _ = api
    with client(process, mine) as http:
        group = a_group(http, "Support quality")
        made = http.post("/v1/review-queues", json={"name": "Below", "groupIds": [group], "rule": {"below": True}})
        assert made.status_code == 201, made.text
        queue: dict[str, Any] = made.json()
        assert queue == {"id": queue["id"], "name": "Below", "projectId": "p-rev", "groupIds": [group],
                         "rule": {"below": True, "disagreement": None, "sampleRate": None}, "origins": ["live"],
                         "reviewersPerItem": 1, "reservationSeconds": 600, "capacity": 1000, "keepDays": 30,
                         "maxBytes": 64 * 1024 * 1024}
        assert made.headers["Location"] == f"/v1/review-queues/{queue['id']}"
        read = http.get(f"/v1/review-queues/{queue['id']}")
        assert read.json() == queue and read.headers["ETag"] == made.headers["ETag"]
        assert queue["id"] in [q["id"] for q in http.get("/v1/review-queues").json()["items"]]

        # Sparse: the rule merges key by key, the rest is kept; a null puts a key's default back.
        merged = http.patch(f"/v1/review-queues/{queue['id']}", json={"rule": {"sampleRate": 0.05},
                                                                      "reviewersPerItem": 2})
        assert merged.status_code == 200, merged.text
        assert merged.json()["rule"] == {"below": True, "disagreement": None, "sampleRate": 0.05}
        assert (merged.json()["reviewersPerItem"], merged.json()["name"]) == (2, "Below")
        cleared = http.patch(f"/v1/review-queues/{queue['id']}", json={"rule": {"below": None}})
        assert cleared.json()["rule"] == {"below": False, "disagreement": None, "sampleRate": 0.05}
        # A stale ETag is refused: someone changed the queue since it was read.
        stale = http.patch(f"/v1/review-queues/{queue['id']}", json={"name": "X"},
                           headers={"If-Match": made.headers["ETag"]})
        assert stale.status_code == 412, stale.text

        assert http.delete(f"/v1/review-queues/{queue['id']}").status_code == 204
        assert http.get(f"/v1/review-queues/{queue['id']}").status_code == 404


@pytest.mark.parametrize(("body", "where"), [
    ({"rule": {"sampleRate": 2}}, "rule.sampleRate"),
    ({"rule": {}}, "rule"),
    ({"reviewersPerItem": 5}, "reviewersPerItem"),
    ({"origins": ["live", "live"]}, "origins: each value once"),
])
def test_a_queue_is_refused_with_the_field_that_is_wrong(api: tuple[ApiProcess, str, str], body: dict[str, Any],
                                                         where: str) -> None:
    process, mine, _ = api
    with client(process, mine) as http:
        group = a_group(http, "Refusals")
        refused = http.post("/v1/review-queues", json={"name": "Bad", "groupIds": [group], "rule": {"below": True},
                                                       **body})
        assert refused.status_code == 400, refused.text
        assert where in refused.text, refused.text


def test_a_queue_watches_only_its_own_projects_groups_and_no_one_else_sees_it(
        api: tuple[ApiProcess, str, str]) -> None:
    process, mine, other = api
    with client(process, mine) as http, client(process, other) as theirs:
        their_group = a_group(theirs, "Theirs")
        refused = http.post("/v1/review-queues", json={"name": "Peek", "groupIds": [their_group],
                                                       "rule": {"sampleRate": 1.0}})
        assert refused.status_code == 400
        assert f"groupIds[0]: no scorer group with id '{their_group}' in project 'p-rev'" in refused.text
        made = http.post("/v1/review-queues", json={"name": "Mine", "groupIds": [a_group(http, "Mine")],
                                                    "rule": {"below": True}}).json()
        for ask in (theirs.get(f"/v1/review-queues/{made['id']}"),
                    theirs.patch(f"/v1/review-queues/{made['id']}", json={"name": "Taken"}),
                    theirs.delete(f"/v1/review-queues/{made['id']}")):
            assert ask.status_code == 404, ask.text
        assert made["id"] not in [q["id"] for q in theirs.get("/v1/review-queues").json()["items"]]
        moved = http.patch(f"/v1/review-queues/{made['id']}", json={"groupIds": [their_group]})
        assert moved.status_code == 400, moved.text


async def test_every_worker_has_the_queue_under_the_groups_it_watches(api: tuple[ApiProcess, str, str]) -> None:
    process, mine, _ = api
    with client(process, mine) as http:
        first, second = a_group(http, "First"), a_group(http, "Second")
        made = http.post("/v1/review-queues", json={"name": "Both", "groupIds": [first, second],
                                                    "rule": {"disagreement": 0.4}}).json()
    redis = aioredis.Redis.from_url(process.redis_url)
    try:
        snapshot = await CatalogStore(redis).snapshot()  # as a worker reads it
        assert [q.id for q in snapshot.queues_watching(first)] == [made["id"]]
        assert [q.id for q in snapshot.queues_watching(second)] == [made["id"]]
        assert snapshot.queues[made["id"]].rule.disagreement == 0.4
    finally:
        await redis.aclose()


def an_item(queue: ReviewQueue, n: int, at: float) -> ReviewItem:
    rating = {"id": f"r-{n}", "groupId": queue.group_ids[0], "groupName": "G", "projectId": queue.project_id,
              "agentId": "a", "scope": "trace", "traceId": f"t-{n}", "kind": f"scorer-group:{queue.group_ids[0]}",
              "rating": 2.0, "reason": None, "justification": "low", "members": [],
              "scoredAt": datetime.fromtimestamp(at, UTC).isoformat()}
    return ReviewItem.model_validate({
        "id": f"item-{n}", "queueId": queue.id, "projectId": queue.project_id, "groupId": queue.group_ids[0],
        "ratingId": f"r-{n}", "reason": "below", "origin": "live", "createdAt": rating["scoredAt"],
        "subject": {"scope": "trace", "traceId": f"t-{n}", "input": "q", "output": "a"}, "rating": rating})


async def test_items_are_kept_once_oldest_first_within_capacity_and_keep_days(api: tuple[ApiProcess, str, str]) -> None:
    process, mine, other = api
    with client(process, mine) as http:
        made = http.post("/v1/review-queues", json={"name": "Kept", "groupIds": [a_group(http, "Kept")],
                                                    "rule": {"below": True}, "capacity": 3, "keepDays": 1}).json()
    queue = ReviewQueue.model_validate(made)
    redis = aioredis.Redis.from_url(process.redis_url)
    store = ReviewItems(redis)
    try:
        now = time.time()
        assert [t.taken for t in await store.take([(an_item(queue, 2, now), queue), (an_item(queue, 1, now - 5), queue)],
                                                  now)] == [2]
        # The same item again (a worker that died before its done mark publishes it again): nothing.
        again = await store.take([(an_item(queue, 1, now - 5), queue)], now + 1)
        assert (again[0].taken, again[0].turned_away) == (0, 0)
        full = await store.take([(an_item(queue, n, now), queue) for n in (3, 4, 5)], now + 2)
        assert (full[0].taken, full[0].turned_away) == (1, 2), "capacity 3: the third taken, two turned away"
        with client(process, mine) as http, client(process, other) as theirs:
            page = http.get(f"/v1/review-queues/{queue.id}/items").json()
            assert [i["id"] for i in page["items"]] == ["item-1", "item-2", "item-3"] or \
                [i["id"] for i in page["items"]] == ["item-2", "item-1", "item-3"]  # same instant: either
            assert page["items"][2]["id"] == "item-3", "oldest first"
            assert page["counts"] == {"open": 3, "taken": 3, "turnedAway": 2}
            assert page["items"][0]["subject"]["input"] == "q" and page["items"][0]["rating"]["rating"] == 2.0
            first = http.get(f"/v1/review-queues/{queue.id}/items", params={"limit": 2}).json()
            rest = http.get(f"/v1/review-queues/{queue.id}/items", params={"limit": 2,
                                                                           "cursor": first["nextCursor"]}).json()
            assert len(first["items"]) == 2 and [i["id"] for i in rest["items"]] == ["item-3"]
            assert rest["nextCursor"] is None
            assert theirs.get(f"/v1/review-queues/{queue.id}/items").status_code == 404
        # Past keepDays (a day here), an item goes with the next take.
        await store.take([(an_item(queue, 9, now), queue)], now + 86_400 + 10)
        left, _ = await store.page(queue, state="all", limit=10)
        assert [i.id for i in left] == ["item-9"]
    finally:
        await redis.aclose()


async def test_a_queue_id_another_project_reuses_finds_none_of_the_first_ones_items(
        api: tuple[ApiProcess, str, str]) -> None:
    """The keys are the project's and the queue's (hashed: no id character can break the tag); a
    deleted queue's keys go with it; every key a script writes expires with the queue's keepDays."""
    process, mine, _ = api
    with client(process, mine) as http:
        made = http.post("/v1/review-queues", json={"name": "Reused", "groupIds": [a_group(http, "Reused")],
                                                    "rule": {"below": True}, "keepDays": 2}).json()
    theirs = ReviewQueue.model_validate({**made, "projectId": "p-other"})  # as an operator's file would move it
    queue = ReviewQueue.model_validate(made)
    redis = aioredis.Redis.from_url(process.redis_url)
    store = ReviewItems(redis)
    try:
        now = time.time()
        await store.take([(an_item(queue, 1, now), queue)], now)
        assert (await store.page(theirs))[0] == [] and (await store.counts(theirs))["taken"] == 0
        held = await store.next(queue, "k-ann", now)
        assert held is not None and await store.next(theirs, "k-eve", now) is None
        await store.label(queue, held[0], "k-ann", b'{"rating": 1}', now)
        tag = keys.review_tag(queue.project_id, queue.id)
        for key in (keys.review_items(tag), keys.review_labels(tag), keys.review_done(tag), keys.review_labelled(tag),
                    keys.review_labels_out(tag), keys.review_scores(tag)):
            assert 86_400 < await redis.ttl(key) <= 2 * 86_400, key
        with client(process, mine) as http:
            assert http.delete(f"/v1/review-queues/{queue.id}").status_code == 204
        assert await redis.exists(keys.review_items(tag), keys.review_labels(tag)) == 0
        assert (await store.counts(queue))["taken"] == 0, "gone with the queue"
    finally:
        await redis.aclose()


def test_a_group_watched_by_ten_queues_takes_no_eleventh(api: tuple[ApiProcess, str, str]) -> None:
    process, mine, _ = api
    with client(process, mine) as http:
        group = a_group(http, "Watched")
        for n in range(10):
            made = http.post("/v1/review-queues", json={"name": f"Q{n}", "groupIds": [group], "rule": {"below": True}})
            assert made.status_code == 201, made.text
        refused = http.post("/v1/review-queues", json={"name": "Q10", "groupIds": [group], "rule": {"below": True}})
        assert refused.status_code == 400 and "groupIds[0]" in refused.text and "10 review queues" in refused.text
