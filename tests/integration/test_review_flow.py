"""The review on the real API process and Redis: reviewer keys take the next item and
label it, and nothing else; two reviewers never hold one item; an item with reviewersPerItem
labels from distinct reviewers is done; a reservation that runs out gives the item back. Attacked
as a hostile reviewer and tenant: other projects' items, labels of items not reserved, malformed
and huge labels, a reviewer key on admin routes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from adapters.stores.review_items import LabelRefused, ReviewItems
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.review_rules import review_item_id
from tests.support.api_process import ApiProcess, cli, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

PROJECT = "p-reviews"


class Keys:
    def __init__(self, url: str) -> None:
        self.admin = create_key(url, "--project", PROJECT)
        self.ann = create_key(url, "--project", PROJECT, "--role", "reviewer", "--name", "ann")
        self.bob = create_key(url, "--project", PROJECT, "--role", "reviewer", "--name", "bob")
        self.other_admin = create_key(url, "--project", "p-elsewhere")
        self.other_reviewer = create_key(url, "--project", "p-elsewhere", "--role", "reviewer", "--name", "eve")


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


def a_queue(http: httpx.Client, **fields: Any) -> ReviewQueue:
    judge = http.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()["id"]
    group = http.post("/v1/scorer-groups", json={
        "name": "Tone", "members": [{"kind": "judge", "refId": judge, "label": "Helpful"}],
        "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}}).json()["id"]
    made = http.post("/v1/review-queues", json={"name": "Check", "groupIds": [group], "rule": {"below": True},
                                                **fields})
    assert made.status_code == 201, made.text
    return ReviewQueue.model_validate(made.json())


def item(queue: ReviewQueue, n: int, judge_ref: str = "j") -> ReviewItem:
    at = datetime.fromtimestamp(time.time(), UTC).isoformat()
    rating = {"id": f"r-{n}", "groupId": queue.group_ids[0], "groupName": "Tone", "projectId": queue.project_id,
              "agentId": "a", "scope": "trace", "traceId": f"t-{n}", "kind": "k", "rating": 2.0, "reason": None,
              "justification": "low", "scoredAt": at,
              "members": [{"kind": "judge", "refId": judge_ref, "name": "Helpful", "weight": 1.0, "gate": False,
                           "status": "scored", "native": 2.0, "goodness": 0.2, "detail": "Not helpful."}]}
    return ReviewItem.model_validate({
        "id": review_item_id(queue.id, f"r-{n}"), "queueId": queue.id, "projectId": queue.project_id,
        "groupId": queue.group_ids[0], "ratingId": f"r-{n}", "reason": "below", "origin": "live", "createdAt": at,
        "subject": {"scope": "trace", "traceId": f"t-{n}", "input": f"question {n}", "output": f"answer {n}"},
        "rating": rating})


async def fill(process: ApiProcess, queue: ReviewQueue, count: int) -> list[str]:
    redis = aioredis.Redis.from_url(process.redis_url)
    try:
        items = [item(queue, n) for n in range(count)]
        now = time.time()
        for n, one in enumerate(items):  # one at a time: each its own instant, oldest first
            await ReviewItems(redis).take([(one, queue)], now + n * 0.001)
        return [i.id for i in items]
    finally:
        await redis.aclose()


async def test_two_reviewers_never_hold_one_item_and_two_labels_make_an_item_done(
        api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        queue = a_queue(admin, reviewersPerItem=2)
    ids = await fill(process, queue, 4)
    async with (httpx.AsyncClient(base_url=process.url, headers={"Authorization": f"Bearer {keys.ann}"}) as ann,
                httpx.AsyncClient(base_url=process.url, headers={"Authorization": f"Bearer {keys.bob}"}) as bob):
        # At once, many times each: every answer of one reviewer is the same item, never the other's.
        asked = await asyncio.gather(*(who.post(f"/v1/review-queues/{queue.id}/next") for _ in range(8)
                                       for who in (ann, bob)))
        assert {r.status_code for r in asked} == {200}
        anns = {r.json()["item"]["id"] for r in asked[0::2]}
        bobs = {r.json()["item"]["id"] for r in asked[1::2]}
        assert len(anns) == 1 and len(bobs) == 1 and anns != bobs, (anns, bobs)
        assert anns | bobs == set(ids[:2]), "the two oldest"
        first = next(iter(anns))
        view = asked[0].json()
        assert view["state"] == "open" and view["reservedUntil"] is not None and view["labels"] == []
        assert view["item"]["subject"]["input"].startswith("question")

        label = await ann.put(f"/v1/review-items/{first}/labels/me",
                              json={"rating": 3, "members": {"j": {"agree": True}}, "comment": "Fair."})
        assert label.status_code == 200, label.text
        assert label.json()["done"] is False and label.json()["label"]["reviewer"] == "ann"
        # Changed while open: a new version of the same reviewer's label, still one label.
        again = await ann.put(f"/v1/review-items/{first}/labels/me", json={"rating": 4})
        assert again.json()["label"]["version"] == 2 and again.json()["done"] is False
        # Bob finishes his item, then gets ann's first one (labelled by ann, held by nobody now).
        bobs_item = next(iter(bobs))
        assert (await bob.put(f"/v1/review-items/{bobs_item}/labels/me", json={"rating": 8})).status_code == 200
        then = await bob.post(f"/v1/review-queues/{queue.id}/next")
        assert then.json()["item"]["id"] == first
        assert then.json()["labels"] == [], "a reviewer sees only their own label: people label independently"
        done = await bob.put(f"/v1/review-items/{first}/labels/me", json={"rating": 2})
        assert done.json()["done"] is True
        # Ann's next is never an item she labelled.
        nxt = await ann.post(f"/v1/review-queues/{queue.id}/next")
        assert nxt.json()["item"]["id"] not in (first,)
        refused = await ann.put(f"/v1/review-items/{first}/labels/me", json={"rating": 1})
        assert refused.status_code == 409 and "done" in refused.text
    with client(process, keys.admin) as admin:
        seen = admin.get(f"/v1/review-items/{first}").json()
        assert seen["state"] == "done"
        assert sorted((x["reviewer"], x["rating"], x["version"]) for x in seen["labels"]) == [("ann", 4.0, 2),
                                                                                            ("bob", 2.0, 1)]
        counts = admin.get(f"/v1/review-queues/{queue.id}/items").json()["counts"]
        assert counts["open"] == 3, "the done item left the open items"


async def test_a_reservation_that_runs_out_gives_the_item_back(api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        queue = a_queue(admin, reservationSeconds=30)
    ids = await fill(process, queue, 2)
    redis = aioredis.Redis.from_url(process.redis_url)
    store = ReviewItems(redis)
    try:
        now = time.time()
        assert (await store.next(queue, "k-ann", now))[0] == ids[0]  # type: ignore[index]
        assert (await store.next(queue, "k-bob", now + 29))[0] == ids[1], "held by ann: bob gets the next"  # type: ignore[index]
        with pytest.raises(LabelRefused) as refused:
            await store.label(queue, ids[0], "k-bob", b'{"rating": 1}', now + 29)
        assert refused.value.why == "not_held"
        assert (await store.next(queue, "k-cid", now + 31))[0] == ids[0], "ann's reservation ran out"  # type: ignore[index]
        with pytest.raises(LabelRefused):
            await store.label(queue, ids[0], "k-ann", b'{"rating": 1}', now + 32)  # hers no longer
    finally:
        await redis.aclose()


def test_a_reviewer_key_reviews_and_does_nothing_else(api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        queue = a_queue(admin)
        group = queue.group_ids[0]
    with client(process, keys.ann) as ann:
        assert ann.get("/v1/review-queues").status_code == 200
        assert ann.get(f"/v1/review-queues/{queue.id}").status_code == 200
        for method, path, body in [
                ("GET", "/v1/scorer-groups", None), ("GET", f"/v1/scorer-groups/{group}", None),
                ("POST", "/v1/scorer-groups", {"name": "x", "members": []}),
                ("PATCH", f"/v1/scorer-groups/{group}", {"name": "x"}), ("DELETE", f"/v1/scorer-groups/{group}", None),
                ("POST", "/v1/judges", {"name": "x", "criteria": "y"}), ("GET", "/v1/judges", None),
                ("POST", "/v1/review-queues", {"name": "x", "groupIds": [group], "rule": {"below": True}}),
                ("PATCH", f"/v1/review-queues/{queue.id}", {"capacity": 1}),
                ("DELETE", f"/v1/review-queues/{queue.id}", None),
                ("GET", f"/v1/review-queues/{queue.id}/items", None), ("GET", "/v1/evaluations", None),
                ("POST", "/v1/backfills", {"groupId": group}), ("GET", "/v1/incidents", None)]:
            answer = ann.request(method, path, json=body)
            assert answer.status_code == 403, (method, path, answer.status_code, answer.text)
            assert "reviewer key" in answer.text
    with client(process, keys.admin) as admin:
        assert admin.get(f"/v1/review-queues/{queue.id}").json()["capacity"] == 1000, "nothing changed"


async def test_another_projects_queues_and_items_are_not_there(api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        queue = a_queue(admin)
    ids = await fill(process, queue, 1)
    for key in (keys.other_reviewer, keys.other_admin):
        with client(process, key) as theirs:
            assert theirs.post(f"/v1/review-queues/{queue.id}/next").status_code == 404
            assert theirs.get(f"/v1/review-items/{ids[0]}").status_code == 404
            assert theirs.put(f"/v1/review-items/{ids[0]}/labels/me", json={"rating": 5}).status_code == 404
            assert queue.id not in [q["id"] for q in theirs.get("/v1/review-queues").json()["items"]]
    with client(process, keys.ann) as ann:
        # An item of this project that ann does not hold: not hers to read, nor to label.
        assert ann.get(f"/v1/review-items/{ids[0]}").status_code == 404
        refused = ann.put(f"/v1/review-items/{ids[0]}/labels/me", json={"rating": 5})
        assert refused.status_code == 409 and "take the item first" in refused.text


@pytest.mark.parametrize(("body", "where"), [
    ({"rating": 11}, "rating"),
    ({"rating": "7"}, "rating"),
    ({}, "rating"),
    ({"rating": 5, "members": {"nobody": {"agree": True}}}, "members.nobody"),
    ({"rating": 5, "members": {"j": {"agree": "yes"}}}, "members.j.agree"),
    ({"rating": 5, "comment": "x" * 2_001}, "comment"),
    ({"rating": 5, "reviewer": "someone else"}, "reviewer"),
])
async def test_a_malformed_label_is_refused_with_its_fields_path(api: tuple[ApiProcess, Keys], body: dict[str, Any],
                                                                 where: str) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        queue = a_queue(admin)
    await fill(process, queue, 1)
    with client(process, keys.bob) as bob:
        held = bob.post(f"/v1/review-queues/{queue.id}/next").json()["item"]["id"]
        refused = bob.put(f"/v1/review-items/{held}/labels/me", json=body)
        assert refused.status_code == 400, refused.text
        assert where in refused.text, refused.text
        assert bob.put(f"/v1/review-items/{held}/labels/me", json={"rating": 5}).status_code == 200, \
            "the refusal kept nothing and took no reservation away"


def test_a_reviewer_key_belongs_to_a_project(redis_databases: RedisDatabases) -> None:
    with redis_databases.lease() as url:
        refused = cli(url, "keys", "create", "--operator", "--role", "reviewer")
        assert refused.returncode == 2 and "a reviewer key belongs to a project" in refused.stderr
        create_key(url, "--project", "p-x", "--role", "reviewer", "--name", "rev")
        listed = cli(url, "keys", "list").stdout
        assert "reviewer" in listed and "rev" in listed


async def test_fewer_reviewers_per_item_closes_the_items_that_have_enough_labels(api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        queue = a_queue(admin, reviewersPerItem=2)
    ids = await fill(process, queue, 2)
    with client(process, keys.ann) as ann, client(process, keys.bob) as bob, client(process, keys.admin) as admin:
        assert ann.post(f"/v1/review-queues/{queue.id}/next").json()["item"]["id"] == ids[0]
        assert ann.put(f"/v1/review-items/{ids[0]}/labels/me", json={"rating": 6}).json()["done"] is False
        lowered = admin.patch(f"/v1/review-queues/{queue.id}", json={"reviewersPerItem": 1})
        assert lowered.status_code == 200, lowered.text
        # One label is all the queue asks for now: bob is not handed ann's item for a second.
        assert bob.post(f"/v1/review-queues/{queue.id}/next").json()["item"]["id"] == ids[1]
        assert admin.get(f"/v1/review-items/{ids[0]}").json()["state"] == "done"
        assert admin.get(f"/v1/review-queues/{queue.id}/items").json()["counts"]["open"] == 1


def test_a_null_in_a_queue_patch_puts_the_default_back(api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        queue = a_queue(admin, capacity=5, reservationSeconds=60)
        reset = admin.patch(f"/v1/review-queues/{queue.id}", json={"capacity": None, "reservationSeconds": None})
        assert reset.status_code == 200, reset.text
        assert (reset.json()["capacity"], reset.json()["reservationSeconds"]) == (1000, 600)
        required = admin.patch(f"/v1/review-queues/{queue.id}", json={"name": None})
        assert required.status_code == 400 and "name" in required.text, required.text


async def test_a_label_sent_again_is_kept_once_and_an_item_labelled_by_all_asking_closes(
        api: tuple[ApiProcess, Keys]) -> None:
    process, keys = api
    with client(process, keys.admin) as admin:
        queue = a_queue(admin, reviewersPerItem=3)
    ids = await fill(process, queue, 2)
    redis = aioredis.Redis.from_url(process.redis_url)
    store = ReviewItems(redis)
    try:
        for who in ("k-ann", "k-bob"):
            assert (await store.next(queue, who) or ("",))[0] in ids
        held = {who: (await store.next(queue, who) or ("",))[0] for who in ("k-ann", "k-bob")}
        for who, item in held.items():
            first = await store.label(queue, item, who, b'{"rating": 3, "comment": null, "members": {}}')
            # The same label again (a retry after a 503): kept once, no new version.
            again = await store.label(queue, item, who, b'{"rating": 3, "comment": null, "members": {}}')
            assert (again.version, again.labels) == (first.version, first.labels) == (1, 1)
        # Each labels the other's item: both items have two labels.
        for who, item in (("k-ann", held["k-bob"]), ("k-bob", held["k-ann"])):
            assert (await store.next(queue, who) or ("",))[0] == item
            await store.label(queue, item, who, b'{"rating": 4, "comment": null, "members": {}}')
        lowered = queue.model_copy(update={"reviewers_per_item": 2})  # the queue asks for two now
        assert await store.next(lowered, "k-ann") is None, "nothing left for ann"
        assert (await store.progress(lowered, "k-ann"))["open"] == 0, "the items she labelled closed too"
        # A label sent again to a done item is still answered as kept; a different one is refused.
        done = await store.label(lowered, held["k-ann"], "k-ann", b'{"rating": 3, "comment": null, "members": {}}')
        assert done.done and done.version == 1
        with pytest.raises(LabelRefused) as refused:
            await store.label(lowered, held["k-ann"], "k-ann", b'{"rating": 9, "comment": null, "members": {}}')
        assert refused.value.why == "done"
    finally:
        await redis.aclose()
