"""A traces topic of two partitions, its outputs, a local judge, a producer, and backfill runners
over them (real Kafka and Redis): the backfill runner's tests share it."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from adapters.members.judge import JudgeClient
from adapters.stores import keys
from adapters.stores.backfills import BackfillStore, JobParts
from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from consumers.backfill import BackfillRunner
from consumers.events import Silent
from consumers.outage import OutageGuard
from consumers.outputs import BACKFILL, BACKFILL_ALERTING, Outputs, PublishPolicy, TopicNames
from consumers.pair_protocol import PairProtocol
from devtools.judge_server import JudgeServer
from scorer_groups.api_models import BACKFILL_ENDED, BackfillCreate, BackfillJob
from scoring.catalog import CatalogSnapshot
from scoring.models import Pattern, ScorerGroup
from scoring.panel import Panel
from tests.support.harness import read_topic

DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)
SORRY = "I am so sorry, I apologize for that."


def trace(project: str, n: int, output: str, **extra: Any) -> dict[str, Any]:
    return {"traceId": f"t-{n}", "projectId": project, "agentId": "a", "timestamp": (DAY + timedelta(hours=n)).isoformat(),
            "spans": [{"spanId": "r", "input": "q", "output": output}], **extra}


def group_doc(gid: str, project: str, members: list[dict[str, Any]], **online: Any) -> ScorerGroup:
    return ScorerGroup.model_validate({
        "id": gid, "name": "G", "projectId": project, "members": members,
        "online": {"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high", **online}})


APOLOGY = Pattern(id="apology", name="Apology", polarity="failure", template="apology")
BY_PATTERN = [{"kind": "pattern", "refId": "apology", "weight": 1}]
BY_JUDGE = [{"kind": "judge", "refId": "j", "weight": 1}]


@dataclass
class Bench:
    """A traces topic of two partitions, its outputs, a producer, and runners over them."""

    redis: Redis
    bootstrap: str
    unique: str
    producer: AIOKafkaProducer
    panel: Panel
    judge: JudgeServer
    names: TopicNames = field(init=False)
    project: str = field(init=False)

    def __post_init__(self) -> None:
        u = self.unique
        self.names = TopicNames(traces=f"bf-traces-{u}", ratings=f"bf-ratings-{u}", signals=f"bf-signals-{u}",
                                webhooks=f"bf-webhooks-{u}", dlq="-")
        self.project = f"p-bf-{u}"

    async def produce(self, traces: list[dict[str, Any]], *, counted: bool = True) -> None:
        """Send ``traces``; ``counted``: into their projects' traffic indexes too, as the live
        loop reading them counts them (what an estimate scales by)."""
        stamps = [int(datetime.fromisoformat(t["timestamp"]).timestamp() * 1000) for t in traces]
        sends = [await self.producer.send(self.names.traces, orjson.dumps(t), key=t["traceId"].encode(),
                                          timestamp_ms=at) for t, at in zip(traces, stamps, strict=True)]
        await asyncio.gather(*sends)
        if counted:
            hours = Counter((t["projectId"], at // keys.TRAFFIC_BUCKET_MS) for t, at in zip(traces, stamps, strict=True))
            await RatingsStore(self.redis).write_counts(time.time(), traffic=hours)

    def runner(self, snapshot: Callable[[], CatalogSnapshot], worker: str = "w-1",
               live_pressed: Callable[[], bool] = lambda: False) -> BackfillRunner:
        claims = Claims(self.redis, lease_s=5.0, fill=True)

        def protocol(policy: PublishPolicy) -> PairProtocol:
            return PairProtocol(claims=claims, ratings=RatingsStore(self.redis), panel=self.panel,
                                outputs=Outputs(self.producer, self.names, Silent(), policy=policy),
                                outages=OutageGuard(tolerance_s=60.0))

        return BackfillRunner(jobs=BackfillStore(self.redis), parts=JobParts(self.redis, lease_s=5.0),
                              pairs=protocol(BACKFILL), alerting=protocol(BACKFILL_ALERTING), catalog=snapshot,
                              consumer=lambda: AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None),
                              topic=self.names.traces, worker=worker, max_trace_bytes=1 << 20,
                              live_pressed=live_pressed, interval_s=0.2)

    async def job(self, group: ScorerGroup, rate: float = 1.0, **request: Any) -> str:
        window = BackfillCreate.model_validate({"from": DAY.isoformat(), "to": (DAY + timedelta(days=1)).isoformat(),
                                                **request})
        return (await BackfillStore(self.redis).create(group.id, group.project_id, window, rate)).id

    async def run(self, runner: BackfillRunner, job_id: str, until: Callable[[BackfillJob], bool] | None = None,
                  timeout_s: float = 60) -> BackfillJob:
        """Run the runner until the job has ended (or ``until`` holds of it)."""
        stop = asyncio.Event()
        running = asyncio.create_task(runner.run(stop))
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                job = await BackfillStore(self.redis).get(job_id)
                if (until or (lambda j: j.status in BACKFILL_ENDED))(job):
                    return job
                await asyncio.sleep(0.1)
            raise AssertionError(f"the job did not get there in {timeout_s} s: {job}")
        finally:
            stop.set()
            await running

    async def ratings(self, expected: int, settle_s: float = 1.0) -> list[dict[str, Any]]:
        return await read_topic(self.bootstrap, self.names.ratings, until=lambda v: len(v) >= expected,
                                settle_s=settle_s, timeout_s=30)


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    with JudgeServer() as s:
        yield s


@pytest.fixture
async def bench(redis: Redis, kafka_bootstrap: str, unique: str, judge_server: JudgeServer) -> AsyncIterator[Bench]:
    judge_server.reset()
    judges = JudgeClient(judge_server.base_url, timeout_s=5)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    b = Bench(redis, kafka_bootstrap, unique, producer, Panel(judges=judges, member_deadline_s=10), judge_server)
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(b.names.traces, 2, 1)])
    finally:
        await admin.close()
    try:
        yield b
    finally:
        await producer.stop()
        await judges.close()


