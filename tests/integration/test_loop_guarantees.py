"""The live loop's guarantees, each pinned deterministically on the real broker and Redis.

The loop runs in-process against a member that the test controls: an external scorer on
loopback that holds a chosen trace until the test releases it. So "a trace is still being
scored" is a state the test sets up and ends, not a moment a crash has to land on.

- at-least-once: the committed offset never passes a trace whose scoring is unfinished;
- shutdown: ``drain`` finishes in-flight work and commits it;
- no double spend: a redelivered pair that is done is not scored or published again;
- readiness: an output that cannot be published makes ``/readyz`` answer 503.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from adapters.egress import EgressPolicy
from adapters.members.external import ExternalClient
from adapters.members.http import RetryPolicy
from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from consumers.outputs import TopicNames
from consumers.traces import OutputError, TraceConsumer, TraceLoopLimits
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import ClaimRequest, day_of
from scoring.models import CustomEvaluator, ScorerGroup
from scoring.panel import Panel
from tests.support.gated_scorer import HOLD, GatedScorer
from tests.support.trace_loop import Loop, until
from worker.app import Worker
from worker.metrics import OpsServer
from worker.settings import Settings

pytestmark = pytest.mark.integration

WAIT_S = 30.0  # the waits on the gated scorer and on drain; until() waits tests.support.trace_loop.WAIT_S

def catalog(project: str, scorer_url: str) -> CatalogSnapshot:
    group = ScorerGroup.model_validate({
        "id": "g", "name": "G", "projectId": project,
        "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low"},
        "members": [{"kind": "custom", "refId": "remote", "weight": 1, "gate": False}]})
    remote = CustomEvaluator(id="remote", name="Remote", type="external", url=scorer_url, timeout_ms=60_000)
    return CatalogSnapshot(version=1, groups={"g": group}, customs={"remote": remote})


@pytest.fixture
def scorer() -> Any:
    with GatedScorer() as s:
        yield s


async def make_loop(kafka_bootstrap: str, redis: Redis, scorer: GatedScorer, unique: str,
                    commit_interval_s: float, ratings_config: dict[str, str] | None = None,
                    lease_s: float = 90) -> Loop:
    topics = TopicNames(traces=f"lg-traces-{unique}", ratings=f"lg-ratings-{unique}",
                        signals=f"lg-signals-{unique}", webhooks=f"lg-webhooks-{unique}", dlq=f"lg-dlq-{unique}")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1,
                                            topic_configs=(ratings_config or {}) if t == topics.ratings else {})
                                   for t in (topics.traces, topics.ratings, topics.signals, topics.webhooks,
                                             topics.dlq)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", enable_idempotence=True)
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=f"lg-{unique}",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    project = f"p-{unique}"
    snapshot = catalog(project, scorer.url)
    panel = Panel(external=ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]),
                                          policy=RetryPolicy(attempts=1)), member_deadline_s=60)
    traces = TraceConsumer(consumer=consumer, producer=producer, topics=topics, catalog=lambda: snapshot,
                           panel=panel, claims=Claims(redis, lease_s=lease_s), ratings=RatingsStore(redis),
                           limits=TraceLoopLimits(commit_interval_s=commit_interval_s))
    await producer.start()
    consumer.subscribe([topics.traces], listener=traces.rebalance_listener())
    return Loop(traces, consumer, producer, redis, project, topics, TopicPartition(topics.traces, 0),
                kafka_bootstrap, controls=scorer)


@pytest.fixture
async def loops(kafka_bootstrap: str, redis: Redis, scorer: GatedScorer,
                unique: str) -> AsyncIterator[Callable[..., Awaitable[Loop]]]:
    made: list[Loop] = []

    async def make(commit_interval_s: float = 0.05, **kw: Any) -> Loop:
        loop = await make_loop(kafka_bootstrap, redis, scorer, unique, commit_interval_s, **kw)
        made.append(loop)
        return loop

    yield make
    scorer.release()
    for loop in made:
        await loop.close(drain_s=5)


async def test_the_commit_never_passes_a_trace_still_being_scored(loops: Callable[..., Awaitable[Loop]],
                                                                  scorer: GatedScorer) -> None:
    loop = await loops()
    await loop.start()
    await loop.send("t-0", f"slow {HOLD}")  # offset 0: its scorer answers only when released
    await loop.send("t-1", "quick one")
    await loop.send("t-2", "quick two")
    await loop.done("t-1", "t-2")
    assert scorer.held.is_set() and (await loop.state("g", "t-0")).startswith("lease:"), "t-0 is being scored"

    await loop.traces.commit()  # whatever the timer did, commit now with t-1 and t-2 finished
    assert await loop.committed() in (None, 0), "offsets 1 and 2 are done, but 0 is not: nothing past 0"

    scorer.release()
    await loop.done("t-0")

    async def all_committed() -> bool:
        return await loop.committed() == 3
    await until(all_committed, "the commit to pass all three once t-0 finished")
    assert sorted(r["traceId"] for r in await loop.rating_documents()) == ["t-0", "t-1", "t-2"]


async def test_drain_finishes_in_flight_work_and_commits_it(loops: Callable[..., Awaitable[Loop]],
                                                            scorer: GatedScorer) -> None:
    loop = await loops(commit_interval_s=3600)  # no commit on the timer: only drain's own
    await loop.start()
    await loop.send("t-0", "quick")
    await loop.send("t-1", f"slow {HOLD}")
    await loop.done("t-0")
    await asyncio.to_thread(scorer.held.wait, WAIT_S)
    assert loop.stop is not None and loop.task is not None
    loop.stop.set()
    await loop.task
    draining = asyncio.create_task(loop.traces.drain(WAIT_S))
    scorer.release()  # t-1 finishes while the worker drains
    await draining
    loop.stop = None  # drained: the fixture has nothing left to stop
    assert await loop.committed() == 2, "drain commits what finished, the in-flight trace included"
    assert sorted(r["traceId"] for r in await loop.rating_documents()) == ["t-0", "t-1"]


async def test_a_redelivered_done_pair_is_not_scored_or_published_again(
        loops: Callable[..., Awaitable[Loop]], scorer: GatedScorer) -> None:
    loop = await loops()
    await loop.start()
    await loop.send("t-0", "once")
    await loop.done("t-0")
    await loop.send("t-0", "once")  # the same trace again (a producer retry, a replay)

    async def passed_both() -> bool:
        return await loop.committed() == 2
    await until(passed_both, "the redelivery to be finished and committed")
    assert scorer.requests("once") == 1, "a done pair is skipped: its members are not called again"
    assert [r["traceId"] for r in await loop.rating_documents()] == ["t-0"], "and nothing is published twice"


async def test_an_output_failure_makes_the_worker_unready(loops: Callable[..., Awaitable[Loop]]) -> None:
    # The ratings topic refuses any record over 64 bytes: publishing a rating fails for sure.
    loop = await loops(ratings_config={"max.message.bytes": "64"})
    worker = Worker(Settings())
    worker.consumer = loop.traces
    await loop.start()
    assert worker.readiness() == (True, "ready")
    await loop.send("t-0", "anything")
    assert loop.task is not None
    with pytest.raises(OutputError):
        await asyncio.wait_for(loop.task, WAIT_S)
    ready, why = worker.readiness()
    assert not ready and why.startswith("stopping after an output failure"), why
    ops = OpsServer(0, worker.readiness, host="127.0.0.1")
    await ops.start()
    try:
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{ops.port}/readyz")
        assert answer.status_code == 503 and "output failure" in answer.text
    finally:
        await ops.stop()
    assert await loop.committed() in (None, 0), "the trace whose outputs failed is not committed"


async def test_a_pair_taken_over_while_being_scored_is_not_published_by_its_first_worker(
        loops: Callable[..., Awaitable[Loop]], scorer: GatedScorer) -> None:
    # This worker stalls on t-0 (its scorer holds the call). Meanwhile the pair is taken over
    # and finished elsewhere - as when a worker frozen past its lease resumes: another worker
    # claimed the lapsed lease, scored and marked the pair done.
    loop = await loops(lease_s=2.0)
    await loop.start()
    await loop.send("t-0", f"stalled {HOLD}")
    await asyncio.to_thread(scorer.held.wait, WAIT_S)
    assert (await loop.state("g", "t-0")).startswith("lease:")
    await asyncio.sleep(1.1)  # past half the lease: the worker will ask whether it still holds it
    day = day_of(datetime(2026, 12, 2, 13, tzinfo=UTC).timestamp())
    elsewhere = Claims(loop.redis, owner="another-worker")
    await elsewhere.mark_done([(ClaimRequest(loop.project, "g", "trace:t-0", 0, None, day=day), "rating-elsewhere")])

    scorer.release()  # the stalled worker's result arrives: the pair is no longer its own

    async def finished() -> bool:
        return await loop.committed() == 1
    await until(finished, "t-0 to be finished and committed")
    assert await loop.rating_documents() == [], "the first worker published nothing: one value per pair"
    assert await loop.state("g", "t-0") == "done:rating-elsewhere"
