"""A tenant against review queues as storage, on the real API process and Redis:

- the attack as found: ten queues of capacity 100,000 over one group, each keeping its own copy
  of every result for a year - refused past the project's review quotas
  (``SGW_MAX_PROJECT_REVIEW_ITEMS``, ``SGW_MAX_PROJECT_REVIEW_BYTES``), checked with the save;
- a queue keeps at most its ``maxBytes`` of items however large a tenant's texts: the next result
  is turned away (and counted), measured in Redis - the queue's own counter equals what its
  items take, and goes down as items expire.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from adapters.stores import keys
from adapters.stores.review_items import ReviewItems
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.review_rules import review_item_id
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

PROJECT = "p-hoard"


@pytest.fixture
def api_client(redis_databases: RedisDatabases, tmp_path: Path) -> Iterator[tuple[ApiProcess, httpx.Client]]:
    with redis_databases.lease() as url:
        key = create_key(url, "--project", PROJECT)
        process = ApiProcess(url, tmp_path / "api.log", env={"SGW_MAX_PROJECT_REVIEW_BYTES": str(200 * 1024**2)}
                             ).start()
        try:
            with httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
                yield process, http
        finally:
            process.stop()


def _group(http: httpx.Client) -> str:
    pattern = http.post("/v1/patterns", json={"name": "P", "polarity": "failure", "template": "apology"}).json()
    return str(http.post("/v1/scorer-groups", json={
        "name": "G", "members": [{"kind": "pattern", "refId": pattern["id"]}],
        "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}}).json()["id"])


def test_ten_year_long_queues_of_capacity_100000_over_one_group_are_refused_past_the_quota(
        api_client: tuple[ApiProcess, httpx.Client]) -> None:
    _, http = api_client
    group = _group(http)
    answers = [http.post("/v1/review-queues", json={"name": f"Q{n}", "groupIds": [group], "rule": {"sampleRate": 1},
                                                     "capacity": 100_000, "keepDays": 365})
               for n in range(10)]
    assert answers[0].status_code == 201, answers[0].text
    refused = answers[1]
    assert refused.status_code == 409 and refused.headers["content-type"].startswith("application/problem+json")
    assert refused.json()["quota"] == {"setting": "SGW_MAX_PROJECT_REVIEW_ITEMS", "used": 2_000_000,
                                       "limit": 1_000_000}
    assert {a.status_code for a in answers[1:]} == {409}
    assert http.delete(f"/v1/review-queues/{answers[0].json()['id']}").status_code == 204
    # Bytes: three queues of 64 MiB (the default) fit in 200 MiB, a fourth does not; a smaller one does.
    small = {"groupIds": [group], "rule": {"sampleRate": 1}, "capacity": 10}
    made = [http.post("/v1/review-queues", json={"name": f"S{n}", **small}) for n in range(3)]
    assert [m.status_code for m in made] == [201, 201, 201], made[-1].text
    fourth = http.post("/v1/review-queues", json={"name": "S3", **small})
    assert fourth.status_code == 409 and fourth.json()["quota"]["setting"] == "SGW_MAX_PROJECT_REVIEW_BYTES"
    assert http.post("/v1/review-queues", json={"name": "S4", **small, "maxBytes": 4 * 1024**2}).status_code == 201
    # Shrinking is never refused; what it gives back, another queue may take.
    assert http.patch(f"/v1/review-queues/{made[0].json()['id']}", json={"maxBytes": 1024**2}).status_code == 200
    again = http.post("/v1/review-queues", json={"name": "again", **small, "maxBytes": 60 * 1024**2})
    assert again.status_code == 201, again.text


def _item(queue: ReviewQueue, n: int, text: str) -> ReviewItem:
    at = datetime.fromtimestamp(time.time(), UTC).isoformat()
    rating = {"id": f"r-{n}", "groupId": queue.group_ids[0], "groupName": "G", "projectId": queue.project_id,
              "agentId": "a", "scope": "trace", "traceId": f"t-{n}", "kind": "k", "rating": 2.0, "reason": None,
              "justification": "low", "scoredAt": at, "members": []}
    return ReviewItem.model_validate({
        "id": review_item_id(queue.id, f"r-{n}"), "queueId": queue.id, "projectId": queue.project_id,
        "groupId": queue.group_ids[0], "ratingId": f"r-{n}", "reason": "sample", "origin": "live", "createdAt": at,
        "subject": {"scope": "trace", "traceId": f"t-{n}", "input": text, "output": text}, "rating": rating})


async def test_a_queue_keeps_at_most_its_max_bytes_of_items_and_counts_them_exactly(
        api_client: tuple[ApiProcess, httpx.Client]) -> None:
    process, http = api_client
    group = _group(http)
    made = http.post("/v1/review-queues", json={"name": "Q", "groupIds": [group], "rule": {"sampleRate": 1},
                                                "capacity": 1_000, "maxBytes": 1024**2, "keepDays": 1})
    assert made.status_code == 201, made.text
    queue = ReviewQueue.model_validate(made.json())
    redis = aioredis.Redis.from_url(process.redis_url)
    try:
        store, now = ReviewItems(redis), time.time()
        large = "x" * 19_000  # ~40 KB an item: about 26 fit in 1 MiB
        taken = await store.take([(_item(queue, n, large), queue) for n in range(60)], now)
        assert 20 <= taken[0].taken <= 27 and taken[0].taken + taken[0].turned_away == 60, taken
        tag = keys.review_tag(queue.project_id, queue.id)
        item_ids = await redis.hkeys(keys.review_items(tag))
        kept = sum([await redis.hstrlen(keys.review_items(tag), i) + await redis.hstrlen(keys.review_scores(tag), i)
                    for i in item_ids])
        counted = int(await redis.hget(keys.review_counts(tag), "bytes"))
        assert counted == kept <= 1024**2
        assert (await store.counts(queue))["turnedAway"] == 60 - taken[0].taken
        # A day later the items have expired: taking one frees what they took.
        later = await store.take([(_item(queue, 100, "small"), queue)], now + 86_400 + 1)
        assert later[0].taken == 1
        left = await redis.hkeys(keys.review_items(tag))
        assert [i.decode() for i in left] == [review_item_id(queue.id, "r-100")]
        now_kept = await redis.hstrlen(keys.review_items(tag), left[0]) + await redis.hstrlen(
            keys.review_scores(tag), left[0])
        assert int(await redis.hget(keys.review_counts(tag), "bytes")) == now_kept
    finally:
        await redis.aclose()
