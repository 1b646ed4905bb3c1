"""Review queues through the SDK, both clients' surface as the sync one calls it: an
admin key makes a queue, a reviewer key takes items and labels them, the admin reads the
agreement and exports - and the reviewer key is refused the admin's calls (``Forbidden``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis.asyncio as aioredis

from adapters.stores.review_items import ReviewItems
from scorer_groups import Client, Forbidden
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.review_rules import review_item_id
from tests.support.api_process import ApiProcess, cli, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration


@pytest.fixture
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str, str]]:
    with redis_databases.lease() as url:
        admin = create_key(url, "--project", "p-sdk-review")
        reviewer = create_key(url, "--project", "p-sdk-review", "--role", "reviewer", "--name", "ann")
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield process, admin, reviewer
        finally:
            process.stop()


async def test_a_review_through_the_sdk(api: tuple[ApiProcess, str, str]) -> None:
    process, admin_key, reviewer_key = api
    with Client(process.url, admin_key) as admin:
        judge = admin.monitor.judges.create(name="Helpful", criteria="Helpful?")
        group = admin.monitor.scorer_groups.create("Tone", [{"kind": "judge", "ref_id": judge.id}], online={
            "enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"})
        queue = admin.monitor.review_queues.create("Below", [group.id], {"below": True}, reviewers_per_item=1)
        assert isinstance(queue, ReviewQueue) and queue.reviewers_per_item == 1
        assert admin.monitor.review_queues.update(queue.id, rule={"sample_rate": 0.5}).rule.sample_rate == 0.5
    redis = aioredis.Redis.from_url(process.redis_url)
    at = "2026-12-06T10:00:00Z"
    try:
        for n in range(2):
            item = ReviewItem.model_validate({
                "id": review_item_id(queue.id, f"r-{n}"), "queueId": queue.id, "projectId": "p-sdk-review",
                "groupId": group.id, "ratingId": f"r-{n}", "reason": "below", "origin": "live", "createdAt": at,
                "subject": {"scope": "trace", "traceId": f"t-{n}", "input": "q", "output": "a"},
                "rating": {"id": f"r-{n}", "groupId": group.id, "groupName": "Tone", "projectId": "p-sdk-review",
                           "agentId": "a", "scope": "trace", "kind": "k", "rating": 2.0 + n, "reason": None,
                           "justification": "", "scoredAt": at,
                           "members": [{"kind": "judge", "refId": judge.id, "name": "Helpful", "weight": 1.0,
                                        "gate": False, "status": "scored", "native": 2.0 + n, "goodness": 0.2,
                                        "detail": "."}]}})
            await ReviewItems(redis).take([(item, queue)], time.time() + n)
    finally:
        await redis.aclose()
    with Client(process.url, reviewer_key) as ann:
        assert [q.id for q in ann.monitor.review_queues.list()] == [queue.id]
        for rating in (3, 4):
            view = ann.monitor.review_queues.next(queue.id)
            assert view is not None and view.state == "open"
            done = ann.monitor.review_queues.label(view.item.id, rating, members={judge.id: {"agree": False}},
                                                   comment="too kind")
            assert done.done and done.label.reviewer == "ann"
        assert ann.monitor.review_queues.next(queue.id) is None, "nothing left for ann"
        with pytest.raises(Forbidden):
            ann.monitor.scorer_groups.agreement(group.id)
        with pytest.raises(Forbidden):
            ann.monitor.review_queues.export(queue.id, name="mine")
    with Client(process.url, admin_key) as admin:
        live = admin.monitor.scorer_groups.agreement(group.id)
        assert live.labelled_items == 2 and live.agreement is not None
        assert live.agreement.group.mean_absolute_error == 1.0  # |2-3| and |3-4|
        page = admin.monitor.review_queues.items(queue.id, state="all")
        assert page.counts.taken == 2 and page.counts.open == 0 and len(page.items) == 2
        dataset = admin.monitor.review_queues.export(queue.id, name="Labelled")
        assert dataset.row_count == 2
        # The same from the command line, as the project.
        listed = cli(process.redis_url, "reviews", "list", "--project", "p-sdk-review")
        assert listed.returncode == 0 and f"{queue.id}  Below" in listed.stdout and "taken 2" in listed.stdout
        items = cli(process.redis_url, "reviews", "items", queue.id, "--all", "--project", "p-sdk-review")
        assert items.stdout.count(f"{queue.id}:") == 2 and "(0 open, 2 taken, 0 turned away)" in items.stdout
        agreement = cli(process.redis_url, "reviews", "agreement", group.id, "--project", "p-sdk-review")
        assert json.loads(agreement.stdout)["labelledItems"] == 2
        exported = cli(process.redis_url, "reviews", "export", queue.id, "--dataset", dataset.id,
                       "--project", "p-sdk-review")
        assert exported.returncode == 0 and "version 2: 2 labelled items" in exported.stdout
        elsewhere = cli(process.redis_url, "reviews", "items", queue.id, "--project", "p-other")
        assert elsewhere.returncode == 2 and "no review queue" in elsewhere.stderr, "another project's queue"
        admin.monitor.review_queues.delete(queue.id)
        assert admin.monitor.review_queues.list() == []
