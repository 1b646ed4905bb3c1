"""The agreement watch on real Redis and Kafka, on a driven clock: people label a judge's
verdicts in a review queue; when the judge stops agreeing with them (Spearman under
``alertMinAgreement`` over its last labelled items), two watchers (two workers) open one
``agreement`` incident, and a window of items labelled after the opening in which it agrees again
resolves it. Each judge's figure is exported as a gauge by the worker whose share holds the group."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from adapters.stores.incidents import IncidentStore
from adapters.stores.ratings import RatingsStore
from adapters.stores.review_items import ReviewItems
from consumers.events import Silent
from consumers.fleet_share import FleetShare
from consumers.incidents import IncidentWatcher
from consumers.outputs import Outputs, TopicNames
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.catalog import CatalogSnapshot
from scoring.incidents import AGREEMENT_MIN_ITEMS
from scoring.models import ScorerGroup
from scoring.review_rules import review_item_id
from tests.support.harness import read_topic

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Gauges:
    """The watcher's word on each judge's agreement, as the metrics would hold it."""

    def __init__(self) -> None:
        self.series: dict[tuple[str, str, str], tuple[float, int]] = {}

    def incident_open(self, project_id: str, group_id: str, reason: str, is_open: bool) -> None:
        pass

    def judge_agreement(self, project_id: str, group_id: str, judge: str, spearman: float | None, items: int) -> None:
        if spearman is None:
            self.series.pop((project_id, group_id, judge), None)
        else:
            self.series[(project_id, group_id, judge)] = (spearman, items)


@pytest.fixture
async def producer(kafka_bootstrap: str) -> Any:
    p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await p.start()
    yield p
    await p.stop()


def a_group(unique: str, **online: Any) -> ScorerGroup:
    return ScorerGroup.model_validate({
        "id": f"g-{unique}", "name": "Tone", "projectId": f"p-{unique}",
        "members": [{"kind": "judge", "refId": "helpful", "label": "Helpful", "weight": 1}],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high", **online}})


def a_queue(group: ScorerGroup) -> ReviewQueue:
    return ReviewQueue.model_validate({"id": f"q-{group.id}", "name": "Check", "projectId": group.project_id,
                                       "groupIds": [group.id], "rule": {"sampleRate": 1.0}})


def an_item(queue: ReviewQueue, n: int, judge_says: float, at: float) -> ReviewItem:
    when = datetime.fromtimestamp(at, UTC).isoformat()
    rating = {"id": f"r-{n}", "groupId": queue.group_ids[0], "groupName": "Tone", "projectId": queue.project_id,
              "agentId": "a", "scope": "trace", "traceId": f"t-{n}", "kind": "k", "rating": judge_says,
              "reason": None, "justification": "j", "scoredAt": when,
              "members": [{"kind": "judge", "refId": "helpful", "name": "Helpful", "weight": 1.0, "gate": False,
                           "status": "scored", "native": judge_says, "goodness": judge_says / 10, "detail": "d"}]}
    return ReviewItem.model_validate({
        "id": review_item_id(queue.id, f"r-{n}"), "queueId": queue.id, "projectId": queue.project_id,
        "groupId": queue.group_ids[0], "ratingId": f"r-{n}", "reason": "sample", "origin": "live",
        "createdAt": when, "subject": {"scope": "trace", "traceId": f"t-{n}", "input": "q", "output": "a"},
        "rating": rating})


async def label(redis: Redis, queue: ReviewQueue, verdicts: list[tuple[float, float]], first: int, at: float) -> None:
    """Items the judge gave ``verdicts[i][0]``, each labelled ``verdicts[i][1]`` by a reviewer at ``at``."""
    items = ReviewItems(redis)
    made = [an_item(queue, first + n, judge, at) for n, (judge, _) in enumerate(verdicts)]
    await items.take([(item, queue) for item in made], at)
    people = {item.id: said for item, (_, said) in zip(made, verdicts, strict=True)}
    for _ in verdicts:  # in the order the queue hands them out (taken at one instant: any)
        held = await items.next(queue, "ann", at)
        assert held is not None
        await items.label(queue, held[0], "ann", orjson.dumps({"rating": people[held[0]], "reviewer": "ann"}), at)


def watchers(redis: Redis, producer: AIOKafkaProducer, topics: TopicNames, snapshot: CatalogSnapshot, clock: Clock,
             gauges: Gauges, n: int) -> list[IncidentWatcher]:
    outputs = Outputs(producer, topics, Silent())
    return [IncidentWatcher(store=IncidentStore(redis), ratings=RatingsStore(redis), catalog=lambda: snapshot,
                            send=outputs.send, topics=topics, clock=clock, events=gauges, reviews=ReviewItems(redis))
            for _ in range(n)]


async def test_a_judge_that_stops_agreeing_with_people_opens_one_incident_and_agreeing_again_resolves_it(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group = a_group(unique, alertMinAgreement=0.5)
    queue = a_queue(group)
    snapshot = CatalogSnapshot(groups={group.id: group}, queues={queue.id: queue})
    topics = TopicNames(traces="-", ratings="-", signals=f"agr-signals-{unique}", webhooks=f"agr-hooks-{unique}",
                        dlq="-")
    clock, gauges = Clock(time.time()), Gauges()
    two = watchers(redis_db_client, producer, topics, snapshot, clock, gauges, 2)

    # The judge ranks the items backwards from people: too few labels first, then enough.
    backwards = [(float(n), float(9 - n)) for n in range(AGREEMENT_MIN_ITEMS)]
    await label(redis_db_client, queue, backwards[:AGREEMENT_MIN_ITEMS - 1], 0, clock.now)
    await asyncio.gather(*(w.tick() for w in two))
    assert gauges.series[(group.project_id, group.id, "helpful")] == (-1.0, AGREEMENT_MIN_ITEMS - 1)
    clock.now += 5
    await label(redis_db_client, queue, backwards[-1:], AGREEMENT_MIN_ITEMS - 1, clock.now)
    for _ in range(3):
        await asyncio.gather(*(w.tick() for w in two))  # opens once, however often they look
    assert gauges.series[(group.project_id, group.id, "helpful")] == (-1.0, AGREEMENT_MIN_ITEMS)

    # People and the judge agree again on what is labelled after the opening - but too few first.
    clock.now += 5
    along = [(float(n), float(n) + 0.5) for n in range(AGREEMENT_MIN_ITEMS)]
    await label(redis_db_client, queue, along[:AGREEMENT_MIN_ITEMS - 1], 100, clock.now)
    await asyncio.gather(*(w.tick() for w in two))
    clock.now += 5
    await label(redis_db_client, queue, along[-1:], 200, clock.now)
    for _ in range(3):
        await asyncio.gather(*(w.tick() for w in two))

    signals = await read_topic(kafka_bootstrap, topics.signals, until=lambda v: len(v) >= 2, settle_s=1)
    assert [(s["reason"], s["state"]) for s in signals] == [("agreement", "opened"), ("agreement", "resolved")]
    assert signals[0]["incidentId"] == signals[1]["incidentId"]
    assert f"Helpful -1.00 over {AGREEMENT_MIN_ITEMS} items" in signals[0]["justification"], signals[0]
    assert f"Helpful 1.00 over {AGREEMENT_MIN_ITEMS} items" in signals[1]["justification"], signals[1]
    (incident,) = await IncidentStore(redis_db_client).incidents(group.id)
    assert (incident["state"], incident["reason"]) == ("resolved", "agreement")


async def test_the_gauge_is_the_owning_workers_and_a_group_without_the_alert_opens_nothing(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group = a_group(unique)  # no alertMinAgreement: the figure is exported, no incident
    queue = a_queue(group)
    snapshot = CatalogSnapshot(groups={group.id: group}, queues={queue.id: queue})
    topics = TopicNames(traces="-", ratings="-", signals=f"agr2-signals-{unique}", webhooks="-", dlq="-")
    clock = Clock(time.time())
    await label(redis_db_client, queue, [(float(n), float(9 - n)) for n in range(AGREEMENT_MIN_ITEMS)], 0, clock.now)
    outputs = Outputs(producer, topics, Silent())
    shares = [FleetShare.everything(), FleetShare.everything()]
    shares[1].shards = frozenset()  # another worker's share: none of this group's
    gauges = [Gauges(), Gauges()]
    for share, said in zip(shares, gauges, strict=True):
        await IncidentWatcher(store=IncidentStore(redis_db_client), ratings=RatingsStore(redis_db_client), catalog=lambda: snapshot,
                              send=outputs.send, topics=topics, clock=clock, events=said, share=share,
                              reviews=ReviewItems(redis_db_client)).tick()
    assert gauges[0].series == {(group.project_id, group.id, "helpful"): (-1.0, AGREEMENT_MIN_ITEMS)}
    assert gauges[1].series == {}, "only the worker whose share holds the group exports its figure"
    assert await IncidentStore(redis_db_client).incidents(group.id) == []
