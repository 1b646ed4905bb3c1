"""The session sweeper's bookkeeping on the real Redis and broker: a conversation another worker
is judging stays in the index and is judged once that worker's lease runs out; one judged at
its length is not judged again; one that failed to publish is released and retried."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from consumers.events import NoEvents
from consumers.outputs import Outputs, TopicNames
from consumers.sessions import SessionSweeper
from scoring.models import Pattern, ScorerGroup
from scoring.panel import Panel
from scoring.stores import keys
from scoring.stores.catalog import CatalogSnapshot
from scoring.stores.claims import ClaimRequest, Claims, day_of
from scoring.stores.ratings import RatingsStore
from scoring.stores.sessions import QuietSession, SessionStore
from scoring.subjects import Trace
from tests.e2e.harness import read_topic

pytestmark = pytest.mark.integration

TURNS_DAY = day_of(datetime(2026, 12, 2, tzinfo=UTC).timestamp())  # the turns' own day

GROUP = ScorerGroup.model_validate({
    "id": "conv", "name": "Conversation", "projectId": "p-sw",
    "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low",
               "scope": "session", "idleSeconds": 0},
    "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]})
CATALOG = CatalogSnapshot(version=1, groups={"conv": GROUP},
                          patterns={"apology": Pattern(id="apology", name="Apology", polarity="failure",
                                                       template="apology")})


def turn(session: str, n: int) -> Trace:
    return Trace.model_validate({"traceId": f"{session}-{n}", "projectId": "p-sw", "agentId": "a", "sessionId": session,
                                 "timestamp": f"2026-12-02T13:00:0{n}Z",
                                 "spans": [{"spanId": "r", "input": "q", "output": "fine"}]})


@pytest.fixture
async def parts(redis_url: str, kafka_bootstrap: str, unique: str) -> AsyncIterator[dict[str, Any]]:
    url = redis_url.rsplit("/", 1)[0] + "/10"
    redis = Redis.from_url(url)
    await redis.flushdb()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    topics = TopicNames(traces="-", ratings=f"sw-ratings-{unique}", signals=f"sw-signals-{unique}",
                        webhooks=f"sw-webhooks-{unique}", dlq="-")
    store, claims = SessionStore(redis), Claims(redis, lease_s=1.0)
    sweeper = SessionSweeper(store=store, outputs=Outputs(producer, topics, NoEvents()), catalog=lambda: CATALOG,
                             panel=Panel(), claims=claims, ratings=RatingsStore(redis))
    yield {"redis": redis, "store": store, "claims": claims, "sweeper": sweeper, "topics": topics, "producer": producer}
    await producer.stop()
    await redis.flushdb()
    await redis.aclose()


async def test_busy_sessions_stay_until_judged_and_judged_ones_are_not_judged_again(
        parts: dict[str, Any], kafka_bootstrap: str) -> None:
    redis, store, sweeper = parts["redis"], parts["store"], parts["sweeper"]
    now = time.time()
    await store.record([turn("s-busy", 1), turn("s-busy", 2), turn("s-free", 1), turn("s-free", 2)], now=now - 5)
    # Another worker holds the lease on s-busy at 2 turns.
    other = Claims(redis, lease_s=1.0)
    (held,) = await other.claim_many([ClaimRequest("p-sw", "conv", "session:s-busy:2", 0, None, day=TURNS_DAY)])
    assert held.state == "claimed"

    assert await sweeper.sweep_once(now=now) == 1, "only s-free was ours to judge"
    index = {m.decode() for m in await redis.zrange(keys.session_activity("p-sw"), 0, -1)}
    assert index == {"s-busy"}, "s-free is settled and leaves the index; s-busy stays"

    assert await sweeper.sweep_once(now=now) == 0, "still busy: nobody judges it twice"
    await asyncio.sleep(1.1)  # the other worker died: its lease runs out
    assert await sweeper.sweep_once(now=time.time()) == 1
    assert await sweeper.sweep_once(now=time.time()) == 0, "judged at this length: not again"
    ratings = await read_topic(kafka_bootstrap, parts["topics"].ratings, until=lambda v: len(v) >= 2, settle_s=1)
    assert sorted((r["sessionId"], r["turns"]) for r in ratings) == [("s-busy", 2), ("s-free", 2)]


@pytest.mark.parametrize("depth", [150, 199, 255])
async def test_a_poisoned_session_never_blocks_the_others(parts: dict[str, Any], kafka_bootstrap: str,
                                                          depth: int) -> None:
    # Stored before the decoder refused deep nesting (or written by anything else): a turn no
    # member can read. The sweep drops that session and judges the rest.
    redis, store, sweeper = parts["redis"], parts["store"], parts["sweeper"]
    now = time.time()
    await store.record([turn("s-poison", 1), turn("s-poison", 2), turn("s-fine", 1), turn("s-fine", 2)], now=now - 5)
    poison = turn("s-poison", 3).model_dump_json(by_alias=True).replace('"fine"', "[" * depth + "]" * depth)
    await redis.hset(keys.session_turns("p-sw", "s-poison"), "s-poison-3", poison)
    await redis.hset(keys.session_turns("p-sw", "s-poison"), "s-poison-4", b"\xff not json")

    judged = await sweeper.sweep_once(now=now)
    ratings = await read_topic(kafka_bootstrap, parts["topics"].ratings, until=lambda v: len(v) >= judged, settle_s=0.5)
    assert "s-fine" in {r["sessionId"] for r in ratings}
    index = {m.decode() for m in await redis.zrange(keys.session_activity("p-sw"), 0, -1)}
    assert "s-poison" not in index, "the poisoned session leaves the index instead of coming back every tick"


class ReadsRecorded(SessionStore):
    """The real store, noting how long each session it hands the sweep had been quiet."""

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self.quiet_for: list[float] = []

    async def quiet(self, project_id: str, quiet_for_s: float, now: float | None = None,
                    offset: int = 0, limit: int = 200) -> list[QuietSession]:
        found = await super().quiet(project_id, quiet_for_s, now, offset, limit)
        assert now is not None
        self.quiet_for += [now - s.last_activity for s in found]
        return found


async def test_a_session_is_judged_only_once_quiet_for_its_groups_idle_seconds(
        parts: dict[str, Any], kafka_bootstrap: str) -> None:
    def session_group(group_id: str, idle: int) -> ScorerGroup:
        return ScorerGroup.model_validate({
            "id": group_id, "name": group_id, "projectId": "p-sw",
            "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low",
                       "scope": "session", "idleSeconds": idle},
            "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]})

    catalog = CatalogSnapshot(version=1, groups={"fast": session_group("fast", 10), "slow": session_group("slow", 60)},
                              patterns=CATALOG.patterns)
    store = ReadsRecorded(parts["redis"])
    sweeper = SessionSweeper(store=store, outputs=Outputs(parts["producer"], parts["topics"], NoEvents()),
                             catalog=lambda: catalog, panel=Panel(), claims=parts["claims"],
                             ratings=RatingsStore(parts["redis"]))
    t0 = float(int(time.time()))  # whole seconds: t0 + 10 - 10 is exactly t0
    await store.record([turn("s-idle", 1), turn("s-idle", 2)], now=t0)
    for n in range(3):  # busier conversations, still talking
        await store.record([turn(f"s-busy{n}", 1), turn(f"s-busy{n}", 2)], now=t0 + 5)

    assert await sweeper.sweep_once(now=t0 + 9) == 0, "quiet 9 s: no group's idle time has passed"
    assert store.quiet_for == [], "nothing quiet for the shortest idle time is even read"
    assert await sweeper.sweep_once(now=t0 + 10) == 1, "quiet 10 s: only the 10 s group judges it"
    for n in range(3):
        await store.record([turn(f"s-busy{n}", 3)], now=t0 + 55)
    assert await sweeper.sweep_once(now=t0 + 59) == 0, "judged by fast at 2 turns; slow still waits"
    assert await sweeper.sweep_once(now=t0 + 60) == 1, "quiet 60 s: now the slow group"
    assert min(store.quiet_for) >= 10, "the sweep reads only sessions quiet for the shortest idle time"
    ratings = await read_topic(kafka_bootstrap, parts["topics"].ratings, until=lambda v: len(v) >= 2)
    assert sorted((r["groupId"], r["sessionId"]) for r in ratings) == [("fast", "s-idle"), ("slow", "s-idle")]
