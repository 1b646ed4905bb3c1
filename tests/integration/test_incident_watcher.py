"""The incident watcher on real Redis and Kafka, on a driven clock: a group in window
mode fed a dip and a recovery through the ratings history - two watchers side by side (two
workers) publish exactly one opened and one resolved Signal, and one delivery per channel and
event, none per result; an event moved by a watcher that died before publishing is published by
the next one; coverage opens when results have no score, and resolves when they score again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from adapters.stores import keys
from adapters.stores.incidents import PENDING_S, IncidentStore, bucket_size
from adapters.stores.ratings import RatingsStore
from consumers.events import Silent
from consumers.incidents import IncidentWatcher
from consumers.outputs import Outputs, TopicNames
from scoring.catalog import CatalogSnapshot
from scoring.incidents import Watch
from scoring.models import AlertChannel, ScorerGroup
from scoring.results import HistoryEntry
from tests.support.harness import read_topic

pytestmark = pytest.mark.integration
# Each test's ``redis_db_client`` is a database of its own: a watcher resolves every open incident it does
# not watch (the fleet shares one catalog), so watchers of two tests must not share one.

WINDOW_S = 60


def a_group(unique: str, **alerts: Any) -> ScorerGroup:
    return ScorerGroup.model_validate({
        "id": f"g-{unique}", "name": "Release bar", "projectId": f"p-{unique}",
        "members": [{"kind": "pattern", "refId": "x", "weight": 1}],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high",
                   "alertWindowSeconds": WINDOW_S, "alertMinResults": 5, **alerts}})


def catalog(group: ScorerGroup) -> CatalogSnapshot:
    channels = {f"{fmt}": AlertChannel.model_validate({"agentId": "support", "url": f"https://hooks.example/{fmt}",
                                                        "projectId": group.project_id, "format": fmt,
                                                        **({"routingKey": "rk"} if fmt == "pagerduty" else {})})
                for fmt in ("standard", "slack", "pagerduty")}
    return CatalogSnapshot(groups={group.id: group}, channels=channels)


async def results(redis: Redis, group: ScorerGroup, at: float, scores: list[float | None],
                  agent: str = "support", past: bool = False) -> None:
    """Results as the pair protocol records them: counted in the buckets, kept among the latest."""
    entries = []
    for n, score in enumerate(scores):
        doc = {"id": f"r-{agent}-{at}-{n}", "agentId": agent, "scoredAt": datetime.fromtimestamp(at, UTC).isoformat(),
               "rating": score}
        entries.append(HistoryEntry(group.id, score, score is not None and score < 6, at, orjson.dumps(doc),
                                    past=past))
    await RatingsStore(redis).write(entries)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def producer(kafka_bootstrap: str) -> Any:
    p = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await p.start()
    yield p
    await p.stop()


def watchers(redis: Redis, producer: AIOKafkaProducer, topics: TopicNames, group: ScorerGroup, clock: Clock,
             n: int) -> list[IncidentWatcher]:
    outputs = Outputs(producer, topics, Silent())
    return [IncidentWatcher(store=IncidentStore(redis), ratings=RatingsStore(redis), catalog=lambda: catalog(group),
                            send=outputs.send, topics=topics, clock=clock) for _ in range(n)]


def topics_of(unique: str) -> TopicNames:
    return TopicNames(traces="-", ratings="-", signals=f"inc-signals-{unique}", webhooks=f"inc-hooks-{unique}",
                      dlq="-")


async def test_a_dip_opens_one_incident_and_a_recovery_resolves_it_whatever_the_number_of_watchers(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group, topics = a_group(unique, alertMode="window", alertResolveAbove=7), topics_of(unique)
    bucket = int(time.time()) // 60 * 60 - 60  # a minute's bucket, in the past: its results are where we say
    clock = Clock(bucket + 10)
    two = watchers(redis_db_client, producer, topics, group, clock, 2)

    await results(redis_db_client, group, bucket + 5, [3.0] * 4)
    await asyncio.gather(*(w.tick() for w in two))  # below, but 4 results: too few
    await results(redis_db_client, group, bucket + 6, [3.0] * 6)
    for _ in range(3):
        await asyncio.gather(*(w.tick() for w in two))  # opens once, however often they look
    await results(redis_db_client, group, bucket + 65, [6.5] * 10)  # at the threshold, under alertResolveAbove
    clock.now = bucket + 70
    await asyncio.gather(*(w.tick() for w in two))
    await results(redis_db_client, group, bucket + 125, [8.5] * 10)
    clock.now = bucket + 130  # the window (from bucket + 120) holds only the recovery, a whole window after
    for _ in range(3):
        await asyncio.gather(*(w.tick() for w in two))

    signals = await read_topic(kafka_bootstrap, topics.signals, until=lambda v: len(v) >= 2, settle_s=1)
    hooks = await read_topic(kafka_bootstrap, topics.webhooks, until=lambda v: len(v) >= 6, settle_s=1)
    assert [(s["reason"], s["state"]) for s in signals] == [("window_below", "opened"), ("window_below", "resolved")]
    assert signals[0]["incidentId"] == signals[1]["incidentId"] and signals[0]["rating"] == 3.0
    assert "mean of 3.00/10 over 10 results" in signals[0]["justification"]
    assert sorted((h["event"], h["url"].rsplit("/", 1)[1]) for h in hooks) == sorted(
        (f"scorer_group.incident.{state}", fmt) for state in ("opened", "resolved")
        for fmt in ("standard", "slack", "pagerduty")), "one delivery per channel and event"
    (incident,) = await IncidentStore(redis_db_client).incidents(group.id)
    assert (incident["state"], incident["reason"], incident["id"]) == ("resolved", "window_below",
                                                                       signals[0]["incidentId"])


async def test_an_event_moved_by_a_watcher_that_died_is_published_by_the_next(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group, topics = a_group(unique, alertMode="window"), topics_of(unique)
    store = IncidentStore(redis_db_client)
    signal = {"key": f"scorer-group:{group.id}", "id": "s-1", "state": "opened"}
    moved = await store.move(group.id, "window_below", Watch(), Watch("inc-1", time.time(), 1),
                             {"signal": signal, "deliveries": []}, {"id": "inc-1"})
    assert moved and not await store.move(group.id, "window_below", Watch(), Watch("inc-2", time.time(), 1),
                                          {"signal": signal, "deliveries": []}, {"id": "inc-2"}), "once"
    assert not await store.move(group.id, "window_below", Watch("inc-1", time.time(), 1), Watch(version=2),
                                {"signal": signal, "deliveries": []}, {"id": "inc-1"}), \
        "never over an event still pending (a resolution whose mover died would be lost)"
    # ... and the mover died before publishing. A watcher looks a moment later: too soon.
    clock = Clock(time.time() + 1)
    (watcher,) = watchers(redis_db_client, producer, topics, group, clock, 1)
    await watcher.tick()
    assert (await store.watch(group.id, "window_below"))[1] is not None, "still pending"
    clock.now = time.time() + PENDING_S + 1
    await watcher.tick()
    (published,) = await read_topic(kafka_bootstrap, topics.signals, until=lambda v: len(v) >= 1, settle_s=1)
    assert published["id"] == "s-1"
    assert (await store.watch(group.id, "window_below"))[1] is None, "acknowledged"


class MovesAfterAnother(IncidentStore):
    """The store of a watcher that is slow between reading a watch and moving it: at its first
    move, ``meanwhile`` runs first (another watcher's whole tick: it moves the watch and
    publishes, acknowledging its event); then the move goes to Redis from what was read before."""

    def __init__(self, redis: Redis, meanwhile: Callable[[], Awaitable[None]]) -> None:
        super().__init__(redis)
        self._meanwhile: Callable[[], Awaitable[None]] | None = meanwhile
        self.answers: list[bool] = []

    async def move(self, *args: Any, **kwargs: Any) -> bool:
        meanwhile, self._meanwhile = self._meanwhile, None
        if meanwhile is not None:
            await meanwhile()
        answer = await super().move(*args, **kwargs)
        self.answers.append(answer)
        return answer


async def test_a_watcher_that_read_the_watch_before_anothers_move_was_acknowledged_moves_nothing(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    """The case the version guards, not the pending event: the late watcher reads the watch (no
    incident, version 0) at ``bucket + 10``; the first reads it after, at ``bucket + 12``, opens
    the incident, publishes and acknowledges (nothing is pending any more); then the late one
    moves from what it read. Refused: the watch, the incident and the topics stay the first's -
    no second opening, no second page."""
    group, topics = a_group(unique, alertMode="window"), topics_of(unique)
    bucket = int(time.time()) // 60 * 60 - 60
    await results(redis_db_client, group, bucket + 5, [3.0] * 10)
    clock = Clock(bucket + 10)
    outputs = Outputs(producer, topics, Silent())
    store = IncidentStore(redis_db_client)
    first = IncidentWatcher(store=store, ratings=RatingsStore(redis_db_client), catalog=lambda: catalog(group),
                            send=outputs.send, topics=topics, clock=clock)
    after_first: list[Any] = []

    async def first_moves_and_publishes() -> None:
        clock.now = bucket + 12
        await first.tick()
        after_first.extend([await store.watch(group.id, "window_below"), await store.incidents(group.id),
                            await store.open_watches()])

    late_store = MovesAfterAnother(redis_db_client, first_moves_and_publishes)
    late = IncidentWatcher(store=late_store, ratings=RatingsStore(redis_db_client), catalog=lambda: catalog(group),
                           send=outputs.send, topics=topics, clock=clock)
    await late.tick()

    (watch, pending), (incident,), open_now = after_first
    assert (watch.version, watch.opened_at, pending) == (1, bucket + 12, None), "the first opened and acknowledged"
    assert (incident["id"], incident["state"], incident["openedAt"]) == (
        watch.incident_id, "open", datetime.fromtimestamp(bucket + 12, UTC).isoformat())
    assert late_store.answers == [False], "the late watcher's move is refused"
    assert [await store.watch(group.id, "window_below"), await store.incidents(group.id),
            await store.open_watches()] == after_first == [(watch, None), [incident], open_now], "nothing changed"
    signals = await read_topic(kafka_bootstrap, topics.signals, until=lambda v: len(v) >= 2, timeout_s=3)
    hooks = await read_topic(kafka_bootstrap, topics.webhooks, until=lambda v: len(v) >= 4, timeout_s=3)
    assert [(s["state"], s["incidentId"]) for s in signals] == [("opened", watch.incident_id)], "one opening"
    assert len(hooks) == 3, "one page per channel, once"


async def test_a_resolution_read_before_the_incident_resolved_and_reopened_leaves_the_new_one_open(
        redis_db_client: Redis, unique: str) -> None:
    """A mover that read an open incident (version 1) and moves to resolve it after another
    resolved it (2) and a newer reading reopened one (3), each acknowledged: refused, the new
    incident stays open on its watch - else the watch would go back to version 2, its open
    incident forgotten, and the next opening would be named as the one already open."""
    store, group_id, t0 = IncidentStore(redis_db_client), f"g-{unique}", time.time() - 600

    def record(incident: str, state: str, opened: float) -> dict[str, Any]:
        return {"id": incident, "groupId": group_id, "reason": "window_below", "state": state,
                "openedAt": datetime.fromtimestamp(opened, UTC).isoformat()}

    assert await store.move(group_id, "window_below", Watch(), Watch("inc-1", t0, 1), {}, record("inc-1", "open", t0))
    await store.published(group_id, "window_below", 1)
    stale, _ = await store.watch(group_id, "window_below")
    assert stale == Watch("inc-1", t0, 1)
    assert await store.move(group_id, "window_below", stale, Watch(version=2), {}, record("inc-1", "resolved", t0))
    await store.published(group_id, "window_below", 2)
    reopened = Watch("inc-3", t0 + 300, 3)
    assert await store.move(group_id, "window_below", Watch(version=2), reopened, {},
                            record("inc-3", "open", t0 + 300))
    await store.published(group_id, "window_below", 3)

    assert not await store.move(group_id, "window_below", stale, Watch(version=2), {"stale": True},
                                record("inc-1", "resolved", t0)), "the stale resolution is refused"
    assert await store.watch(group_id, "window_below") == (reopened, None)
    assert await store.open_watches() == [(group_id, "window_below")]
    assert sorted((r["id"], r["state"]) for r in await store.incidents(group_id)) == [("inc-1", "resolved"),
                                                                                    ("inc-3", "open")]


async def test_a_late_acknowledgment_of_an_older_move_leaves_the_newer_event_pending(
        redis_db_client: Redis, unique: str) -> None:
    """A mover slow to publish (its event went stale, the next watcher published it again,
    acknowledged it and moved the watch on) acknowledges at last: the newer event stays pending -
    else a newer mover that died before publishing would have its event lost."""
    store, group_id, t0 = IncidentStore(redis_db_client), f"g-{unique}", time.time() - 600
    opened = Watch("inc-1", t0, 1)
    assert await store.move(group_id, "window_below", Watch(), opened, {"n": 1}, {"id": "inc-1"}, now=t0)
    await store.published(group_id, "window_below", 1)  # the next watcher, once the event was stale
    assert await store.move(group_id, "window_below", opened, Watch(version=2), {"n": 2}, {"id": "inc-1"}, now=t0 + 90)
    await store.published(group_id, "window_below", 1)  # the slow mover, at last
    assert await store.watch(group_id, "window_below") == (Watch(version=2), {"n": 2, "movedAt": t0 + 90})


async def test_coverage_opens_when_results_go_without_a_score_and_resolves_when_they_score_again(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group, topics = a_group(unique, alertNoScoreRate=0.5), topics_of(unique)
    bucket = int(time.time()) // 60 * 60 - 60
    await results(redis_db_client, group, bucket + 5, [8.0] * 2 + [None] * 4)  # each mode: no window alert, coverage only
    clock = Clock(bucket + 10)
    (watcher,) = watchers(redis_db_client, producer, topics, group, clock, 1)
    await watcher.tick()
    await results(redis_db_client, group, bucket + 125, [8.0] * 6)  # the judge is back
    clock.now = bucket + 130
    await watcher.tick()
    opened, resolved = await read_topic(kafka_bootstrap, topics.signals, until=lambda v: len(v) >= 2, settle_s=1)
    assert (opened["reason"], opened["state"], resolved["state"]) == ("coverage", "opened", "resolved")
    assert "67% of 6 results" in opened["justification"] and resolved["incidentId"] == opened["incidentId"]


async def test_each_channel_hears_under_its_own_agent_and_the_resolution_goes_where_the_opening_went(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group, topics = a_group(unique, alertMode="window"), topics_of(unique)
    channels = {agent: AlertChannel.model_validate({"agentId": agent, "url": f"https://hooks.example/{agent}",
                                                    "projectId": group.project_id}) for agent in ("alpha", "beta")}
    snap = CatalogSnapshot(groups={group.id: group}, channels=channels)
    bucket = int(time.time()) // 60 * 60 - 60
    clock = Clock(bucket + 10)
    watcher = IncidentWatcher(store=IncidentStore(redis_db_client), ratings=RatingsStore(redis_db_client), catalog=lambda: snap,
                              send=Outputs(producer, topics, Silent()).send, topics=topics, clock=clock)
    await results(redis_db_client, group, bucket + 5, [3.0] * 6, agent="alpha")
    await results(redis_db_client, group, bucket + 6, [3.0] * 4, agent="beta")
    await watcher.tick()
    await results(redis_db_client, group, bucket + 125, [8.5] * 10, agent="beta")  # only beta's traffic now
    clock.now = bucket + 130
    await watcher.tick()
    hooks = await read_topic(kafka_bootstrap, topics.webhooks, until=lambda v: len(v) >= 4, settle_s=1)
    heard = sorted((h["event"].rsplit(".", 1)[1], h["agentId"], h["url"].rsplit("/", 1)[1]) for h in hooks)
    assert heard == [("opened", "alpha", "alpha"), ("opened", "beta", "beta"),
                     ("resolved", "alpha", "alpha"), ("resolved", "beta", "beta")]


async def test_an_incident_of_a_watch_no_longer_watched_resolves(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group, topics = a_group(unique, alertMode="window"), topics_of(unique)
    current = [group]
    bucket = int(time.time()) // 60 * 60 - 60
    clock = Clock(bucket + 10)
    store = IncidentStore(redis_db_client)
    watcher = IncidentWatcher(store=store, ratings=RatingsStore(redis_db_client), catalog=lambda: catalog(current[0]),
                              send=Outputs(producer, topics, Silent()).send, topics=topics, clock=clock)
    await results(redis_db_client, group, bucket + 5, [3.0] * 10)
    await watcher.tick()
    assert await store.open_watches() == [(group.id, "window_below")]
    online = group.online.model_copy(update={"alert_mode": "each"})  # type: ignore[union-attr]
    current[0] = group.model_copy(update={"online": online})  # back to a Signal per result
    clock.now += 5
    await watcher.tick()
    opened, resolved = await read_topic(kafka_bootstrap, topics.signals, until=lambda v: len(v) >= 2, settle_s=1)
    assert (opened["state"], resolved["state"], resolved["incidentId"]) == ("opened", "resolved",
                                                                            opened["incidentId"])
    assert "no longer watched" in resolved["justification"]
    assert await store.open_watches() == []
    assert await redis_db_client.ttl(keys.incident_watch(group.id, "window_below")) == -1, \
        "kept: its version names its incidents, and must not start again"
    hooks = await read_topic(kafka_bootstrap, topics.webhooks, until=lambda v: len(v) >= 6, settle_s=1)
    assert sorted(h["event"] for h in hooks).count("scorer_group.incident.resolved") == 3, "the opening's channels"


async def test_a_backfills_results_in_the_window_open_nothing_and_the_chart_still_counts_them(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group, topics = a_group(unique, alertMode="window"), topics_of(unique)
    bucket = int(time.time()) // 60 * 60 - 60
    await results(redis_db_client, group, bucket + 5, [8.0] * 10)  # live traffic, fine
    await results(redis_db_client, group, bucket + 6, [1.0] * 30, past=True)  # the last minute graded again, badly
    (watcher,) = watchers(redis_db_client, producer, topics, group, Clock(bucket + 10), 1)
    await watcher.tick()
    stats = await IncidentStore(redis_db_client).window(group.id, bucket - 50, bucket + 10, time.time())
    assert (stats.results, stats.mean) == (10, 8.0), "the watcher sees live traffic only"
    assert (await RatingsStore(redis_db_client).history(group.id, "1h")).count == 40, "the chart counts both"
    assert await read_topic(kafka_bootstrap, topics.signals, until=lambda v: False, timeout_s=2) == []


async def test_a_group_keeps_its_newest_incidents_and_an_open_one_whatever_its_age(
        redis_db_client: Redis, unique: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "INCIDENTS_KEPT", 4)
    store, group_id, t0 = IncidentStore(redis_db_client), f"g-{unique}", time.time() - 10_000

    def record(incident: str, state: str, opened: float) -> dict[str, Any]:
        return {"id": incident, "groupId": group_id, "reason": "window_below", "state": state,
                "openedAt": datetime.fromtimestamp(opened, UTC).isoformat(), "lastSaid": '"state":"open" in text'}

    # Records from before the order existed: they join it as the oldest, an open one kept too.
    await redis_db_client.hset(keys.group_incidents(group_id), mapping={
        f"old-{n}": orjson.dumps(record(f"old-{n}", "resolved", t0 - 100 * n)) for n in range(1, 5)})
    await redis_db_client.hset(keys.group_incidents(group_id), "old-open", orjson.dumps(record("old-open", "open", t0 - 900)))

    # The oldest incident stays open on one watch while another watch opens and resolves five.
    assert await store.move(group_id, "window_below", Watch(), Watch("inc-a", t0, 1), {}, record("inc-a", "open", t0))
    await store.published(group_id, "window_below", 1)
    watch = Watch()
    for n in range(1, 6):
        opened = Watch(f"inc-{n}", t0 + 100 * n, watch.version + 1)
        assert await store.move(group_id, "coverage", watch, opened, {}, record(f"inc-{n}", "open", t0 + 100 * n))
        await store.published(group_id, "coverage", opened.version)
        watch = Watch(version=opened.version + 1)
        assert await store.move(group_id, "coverage", opened, watch, {}, record(f"inc-{n}", "resolved", t0 + 100 * n))
        await store.published(group_id, "coverage", watch.version)
    kept = sorted(r["id"] for r in await store.incidents(group_id))
    assert kept == ["inc-4", "inc-5", "inc-a", "old-open"], "the open ones however old, then the newest resolved"
    assert await redis_db_client.zcard(keys.group_incidents_order(group_id)) == 4


async def test_drift_learns_every_window_it_missed_and_none_of_a_drift_incidents(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    group, topics = a_group(unique, alertMode="drift"), topics_of(unique)
    base = int(time.time()) // 60 * 60 - 600  # ten minute windows ago: each holds what is put there
    clock = Clock(base + 60 + 10)
    (watcher,) = watchers(redis_db_client, producer, topics, group, clock, 1)
    store = IncidentStore(redis_db_client)
    for n, score in enumerate([8.0, 6.0, 6.0, 6.0, 6.0, 6.0]):
        await results(redis_db_client, group, base + 60 * n + 5, [score] * 10)
    await watcher.tick()  # a new level starts from the last closed window
    level = await store.level(group.id)
    assert (level.learned, level.last_window, level.mean) == (1, base // 60, 8.0)

    clock.now = base + 6 * 60 + 10  # the fleet was away five windows: each is learned, in order
    await watcher.tick()
    level = await store.level(group.id)
    assert (level.learned, level.last_window) == (6, base // 60 + 5)
    assert level.mean == pytest.approx((8.0 + 5 * 6.0) / 6), "the first windows count fully"

    # A drift incident open: its windows pass unlearned, now and once it resolves.
    opened = Watch("inc-drift", clock.now, 1)
    assert await store.move(group.id, "drift", Watch(), opened, {}, {"id": "inc-drift", "state": "open",
                                                                     "openedAt": "2026-12-05T00:00:00+00:00"})
    await store.published(group.id, "drift", 1)
    for n in (6, 7):
        await results(redis_db_client, group, base + 60 * n + 5, [2.0] * 10)
    clock.now = base + 8 * 60 + 10
    await watcher.tick()
    level = await store.level(group.id)
    assert (level.learned, level.last_window) == (6, base // 60 + 7), "passed, not learned"


def test_a_window_is_read_from_the_finest_buckets_still_held_back_to_its_start() -> None:
    assert [bucket_size(reach) for reach in (60, 3_600, 3_601, 86_400, 86_401, 40 * 86_400)] == \
        [60, 60, 900, 900, 3_600, 21_600]


async def test_drift_catching_up_passes_the_windows_the_history_holds_only_coarser(
        redis_db_client: Redis, kafka_bootstrap: str, producer: AIOKafkaProducer, unique: str) -> None:
    window_s = 300
    group, topics = a_group(unique, alertMode="drift", alertWindowSeconds=window_s), topics_of(unique)
    now = int(time.time()) // window_s * window_s + 10
    gone = now - 2 * 3_600  # two hours away: the minutes of its first hour are no longer held
    clock = Clock(gone)
    (watcher,) = watchers(redis_db_client, producer, topics, group, clock, 1)
    for at in range(gone - window_s, now, window_s):  # results in every window (kept here, as written now)
        await results(redis_db_client, group, at + 5, [8.0] * 10)
    await watcher.tick()
    store = IncidentStore(redis_db_client)
    assert (await store.level(group.id)).learned == 1
    clock.now = now
    await watcher.tick()
    level = await store.level(group.id)
    first, last = (gone // window_s), now // window_s - 1  # after the one learned, to the last closed
    held = [w for w in range(first, last + 1) if now - w * window_s <= 3_600]
    assert level.last_window == last and level.learned == 1 + len(held), "the older windows passed"
    assert 0 < len(held) < last + 1 - first
