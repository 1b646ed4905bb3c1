"""A label acknowledged to a reviewer survives a Redis failover, on a real primary and
its replica: a label is answered only once the replica holds it (``WAIT`` on the connection that
wrote it); while the replica cannot acknowledge it (stopped), the label is refused (503, send it
again) rather than acknowledged - replication is asynchronous, and what the primary had not
passed on dies with it. The primary then dies, the replica is promoted: the acknowledged label
is there, and the refused one, sent again, is kept."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import orjson
import pytest
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from adapters.stores.client import NotReplicated
from adapters.stores.review_items import ReviewItems
from devtools.redis_servers import LocalRedis
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.review_rules import review_item_id

pytestmark = pytest.mark.integration


@pytest.fixture
def pair() -> Iterator[tuple[LocalRedis, LocalRedis]]:
    primary, replica = LocalRedis().start(), LocalRedis().start()
    try:
        with SyncRedis(port=replica.port) as r:
            r.replicaof("127.0.0.1", primary.port)
            deadline = time.monotonic() + 20
            while r.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica never linked"
                time.sleep(0.05)
        yield primary, replica
    finally:
        if replica.proc is not None:
            os.killpg(replica.proc.pid, signal.SIGCONT)
        replica.stop()
        primary.stop()


QUEUE = ReviewQueue.model_validate({"id": "q-failover", "name": "Check", "projectId": "p-failover",
                                    "groupIds": ["g"], "rule": {"below": True}, "reviewersPerItem": 2})


def an_item(n: int) -> ReviewItem:
    at = datetime.now(UTC).isoformat()
    return ReviewItem.model_validate({
        "id": review_item_id(QUEUE.id, f"r-{n}"), "queueId": QUEUE.id, "projectId": QUEUE.project_id, "groupId": "g",
        "ratingId": f"r-{n}", "reason": "below", "origin": "live", "createdAt": at,
        "subject": {"scope": "trace", "traceId": f"t-{n}", "input": "q", "output": "a"},
        "rating": {"id": f"r-{n}", "groupId": "g", "groupName": "G", "projectId": QUEUE.project_id, "agentId": "a",
                   "scope": "trace", "traceId": f"t-{n}", "kind": "k", "rating": 2.0, "reason": None,
                   "justification": "j", "scoredAt": at, "members": []}})


async def test_an_acknowledged_label_survives_the_primarys_death(
        pair: tuple[LocalRedis, LocalRedis], monkeypatch: pytest.MonkeyPatch) -> None:
    primary, replica = pair
    monkeypatch.setattr(ReviewItems, "REPLICA_WAIT_MS", 300)
    redis = Redis.from_url(primary.url)  # a server and its replica, whatever the suite runs on
    items = ReviewItems(redis)
    now = time.time()
    kept, refused = an_item(1), an_item(2)
    await items.take([(kept, QUEUE)], now)
    await items.take([(refused, QUEUE)], now + 0.001)  # after: handed out second
    for item in (kept, refused):
        assert (await items.next(QUEUE, "ann", now) or ("",))[0] == item.id
        if item is refused:  # the replica can take nothing now
            assert replica.proc is not None
            os.killpg(replica.proc.pid, signal.SIGSTOP)
            with pytest.raises(NotReplicated):
                await items.label(QUEUE, item.id, "ann", orjson.dumps({"rating": 4}), now)
        else:
            assert (await items.label(QUEUE, item.id, "ann", orjson.dumps({"rating": 3}), now)).version == 1
    await redis.aclose()

    primary.kill()  # dies with the refused label, which its replica never had
    assert replica.proc is not None
    os.killpg(replica.proc.pid, signal.SIGCONT)
    with SyncRedis(port=replica.port) as promoted:
        promoted.replicaof("NO", "ONE")
    redis = Redis.from_url(replica.url)
    try:
        found = await ReviewItems(redis).view(QUEUE, kept.id)
        assert found is not None and found[2]["ann"]["rating"] == 3, found
        # Refused, not acknowledged: the reviewer sends it again, to the promoted server, and it is kept.
        again = await ReviewItems(redis).label(QUEUE, refused.id, "ann", orjson.dumps({"rating": 4}), now)
        assert again.labels == 1, "one label per reviewer, whether or not the first reached the replica"
        assert (await ReviewItems(redis).view(QUEUE, refused.id) or (None, None, {}))[2]["ann"]["rating"] == 4
    finally:
        await redis.aclose()
