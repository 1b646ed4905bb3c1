"""The backfill runner on the real broker and Redis (issue 42): a day of
past traces, a group whose live scoring is off, a job over that day - every trace rated once with
origin "backfill", in the history at the trace's time, paging nobody; the same window again
rates nothing new."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from consumers.backfill import BackfillRunner
from consumers.events import Silent
from consumers.outage import OutageGuard
from consumers.outputs import Outputs, PublishPolicy, TopicNames
from consumers.pairs import PairProtocol
from scorer_groups.api_models import BackfillCreate
from scoring.catalog import CatalogSnapshot
from scoring.models import Pattern, ScorerGroup
from scoring.panel import Panel
from scoring.stores.backfills import BackfillStore, JobParts
from scoring.stores.claims import Claims
from scoring.stores.ratings import RatingsStore
from tests.support.harness import read_topic

pytestmark = pytest.mark.integration

DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=3)
TRACES = 20


async def test_a_job_rates_a_past_days_traces_once_each_as_backfill(redis: Redis, kafka_bootstrap: str,
                                                                     unique: str) -> None:
    topic, project = f"bf-traces-{unique}", f"p-bf-{unique}"
    names = TopicNames(traces=topic, ratings=f"bf-ratings-{unique}", signals=f"bf-signals-{unique}",
                       webhooks=f"bf-webhooks-{unique}", dlq="-")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 2, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        sends = []
        for n in range(TRACES):
            at = DAY + timedelta(hours=n)
            trace = {"traceId": f"t-{n}", "projectId": project, "agentId": "a", "timestamp": at.isoformat(),
                     "spans": [{"spanId": "r", "input": "q", "output": "I am so sorry, I apologize for that." if n % 2 else "done"}]}
            sends.append(await producer.send(topic, orjson.dumps(trace), key=f"t-{n}".encode(),
                                             timestamp_ms=int(at.timestamp() * 1000)))
        # A hostile tenant's trace in the same window, naming another project: never this job's.
        intruder = {"traceId": "intruder", "projectId": f"other-{unique}", "agentId": "a",
                    "timestamp": (DAY + timedelta(hours=1)).isoformat(),
                    "spans": [{"spanId": "r", "input": "q", "output": "done"}]}
        sends.append(await producer.send(topic, orjson.dumps(intruder), key=b"intruder",
                                         timestamp_ms=int((DAY + timedelta(hours=1)).timestamp() * 1000)))
        await asyncio.gather(*sends)
        group = ScorerGroup.model_validate({
            "id": f"g-{unique}", "name": "G", "projectId": project,
            "members": [{"kind": "pattern", "refId": "apology", "weight": 1}],
            "online": {"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}})
        snapshot = CatalogSnapshot(groups={group.id: group}, patterns={
            "apology": Pattern(id="apology", name="Apology", polarity="failure", template="apology")})
        jobs = BackfillStore(redis)
        window = BackfillCreate.model_validate({"from": DAY.isoformat(), "to": (DAY + timedelta(days=1)).isoformat()})

        async def run_a_job() -> str:
            job = await jobs.create(group.id, project, window, 1.0)
            pairs = PairProtocol(claims=Claims(redis, lease_s=5.0), ratings=RatingsStore(redis), panel=Panel(),
                                 outputs=Outputs(producer, names, Silent(), policy=PublishPolicy(
                                     origin="backfill", signals=False, history_at_subject=True)),
                                 outages=OutageGuard(tolerance_s=60.0))
            runner = BackfillRunner(jobs=jobs, parts=JobParts(redis), pairs=pairs, catalog=lambda: snapshot,
                                    consumer=lambda: AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None),
                                    topic=topic, worker="w-1", max_trace_bytes=1 << 20)
            stop = asyncio.Event()
            pairs.start()
            await runner.tick(stop)
            await runner.tick(stop)  # the finish after the last partition
            await pairs.close(5.0)
            return job.id

        first = await run_a_job()
        ratings = await read_topic(kafka_bootstrap, names.ratings, until=lambda v: len(v) >= TRACES, settle_s=1)
        second = await run_a_job()
        again = await read_topic(kafka_bootstrap, names.ratings, until=lambda v: len(v) >= TRACES, settle_s=2)
    finally:
        await producer.stop()

    assert sorted(r["traceId"] for r in ratings) == sorted(f"t-{n}" for n in range(TRACES)), \
        "every trace of the project once; another project's trace in the window is not graded"
    assert {r["origin"] for r in ratings} == {"backfill"}
    assert len(again) == TRACES, "the same window again rates nothing new"
    assert (await jobs.get(first)).status == "done" and (await jobs.get(second)).status == "done"
    progress = (await jobs.get(first)).progress
    assert (progress.fraction, progress.traces_read, progress.pairs_scored) == (1.0, TRACES + 1, TRACES)
    assert (await jobs.get(second)).progress.pairs_scored == 0, "already rated: skipped by the claims"
    history = await RatingsStore(redis).history(group.id, "30d")
    assert history.count == TRACES and history.below == TRACES // 2, "counted, at the traces' own days"
    day_buckets = {b.start for b in history.buckets if b.count}
    assert all(DAY.timestamp() <= start < (DAY + timedelta(days=1)).timestamp() for start in day_buckets)
    signals = await read_topic(kafka_bootstrap, names.signals, until=lambda v: True, timeout_s=3)
    assert signals == [], "last week's traffic pages nobody"
    _ = AIOKafkaConsumer
