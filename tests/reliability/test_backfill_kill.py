"""A backfill shared by two workers, one of them killed mid-job.

Two ``scorer-worker run`` processes, a day of past traces over three partitions, a judge group
(one call to the local judge per trace, answering in 0.5 s) with live scoring off, and a job over
that day. Once the job is under way, the worker holding a partition's lease is killed with
SIGKILL: its leases on the job's partitions and on its claimed pairs are left behind. Then:

- the job completes (the other worker takes the partition over once its lease runs out, from
  the partition's last recorded offset);
- no trace is missing: every trace has a rating with origin "backfill";
- one rating id and one value per trace: a pair may be published again under the same id
  with the same value (at-least-once: the killed worker may have published it and not marked it
  done), never a second rating;
- the judge was called again only for pairs that were in flight when the worker died.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from adapters.stores import keys
from adapters.stores.backfills import BackfillStore
from devtools.judge_server import Behaviour, JudgeServer
from scorer_groups.api_models import BACKFILL_ENDED, BackfillCreate
from tests.support.harness import WorkerProcess, catalog_db, read_topic, worker_env
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)
TRACES, PARTITIONS = 600, 3
JUDGE_DELAY_S = 0.5
LEASE_S = 4  # claims and a job's partition leases: a killed worker's part is taken over in seconds
IN_FLIGHT_BOUND = 32  # pairs a worker claims and scores at once (consumers.backfill.CONCURRENCY)


async def test_a_worker_killed_mid_job_leaves_its_part_to_the_other(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    project = "p-bf-kill"
    catalog = {
        "judges": [{"id": "helpful", "name": "Helpful", "criteria": "Helpful?", "projectId": project}],
        "groups": [{"id": "later", "name": "Later", "projectId": project,
                    "members": [{"kind": "judge", "refId": "helpful", "weight": 1}]}]}
    with JudgeServer() as judge:
        judge.set_default(Behaviour.deterministic(delay=JUDGE_DELAY_S))
        async with catalog_db(redis_db_url, catalog) as url:
            env = worker_env(kafka_bootstrap, url, unique, judge_base_url=judge.base_url, judge_timeout_s=5,
                             claim_lease_s=LEASE_S, member_deadline_s=3, commit_interval_s=0.2)
            await produce_a_past_day(kafka_bootstrap, env["SGW_TRACES_TOPIC"])
            workers = [WorkerProcess(env, name=f"worker-{n}").start(tmp_path) for n in range(2)]
            for worker in workers:
                worker.wait_ready()
            redis = connect(url)
            jobs = BackfillStore(redis)
            try:
                window = BackfillCreate.model_validate({"from": DAY.isoformat(),
                                                        "to": (DAY + timedelta(days=1)).isoformat()})
                job = await jobs.create("later", project, window, 1.0)
                # Under way, a batch in hand: judge calls made, a partition leased - its holder is killed.
                victim = await a_lease_holder_once_under_way(redis, judge, job.id, workers)
                victim.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
                victim.proc.wait()  # type: ignore[union-attr]
                killed_at = await jobs.get(job.id)
                deadline = time.monotonic() + 120
                while (done := await jobs.get(job.id)).status not in BACKFILL_ENDED and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
            finally:
                await redis.aclose()
            ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                       until=lambda v: len({r["traceId"] for r in v}) >= TRACES, settle_s=2)
            for worker in workers:
                if worker is not victim and worker.proc is not None and worker.proc.poll() is None:
                    worker.proc.send_signal(signal.SIGTERM)
                    worker.proc.wait(timeout=60)
            calls = len(judge.requests)

    ids: dict[str, set[str]] = defaultdict(set)
    values: dict[str, set[Any]] = defaultdict(set)
    for r in ratings:
        ids[r["traceId"]].add(r["id"])
        values[r["traceId"]].add(r["rating"])
    missing = {f"t-{n}" for n in range(TRACES)} - set(ids)
    print(f"backfill kill: killed at {killed_at.progress.fraction:.0%} read; ratings={len(ratings)} "
          f"traces={len(ids)} missing={len(missing)} judge_calls={calls} status={done.status} "
          f"progress={done.progress}")
    assert done.status == "done" and done.progress.fraction == 1.0, done
    assert killed_at.progress.fraction < 1, "killed mid-job"
    assert not missing, f"every trace rated: {sorted(missing)[:5]}"
    assert all(len(v) == 1 for v in ids.values()), "one rating id per trace"
    assert all(len(v) == 1 for v in values.values()), "one value per trace"
    assert {r["origin"] for r in ratings} == {"backfill"}
    assert TRACES <= calls <= TRACES + IN_FLIGHT_BOUND, "judged again only what was in flight at the kill"


async def produce_a_past_day(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, PARTITIONS, 1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, acks="all")
    await producer.start()
    try:
        sends = []
        for n in range(TRACES):
            at = DAY + timedelta(seconds=n * 120)  # all within the day
            trace = {"traceId": f"t-{n}", "projectId": "p-bf-kill", "agentId": "a", "timestamp": at.isoformat(),
                     "spans": [{"spanId": "r", "input": "q", "output": f"answer {n} [[rating={n % 10}]]"}]}
            sends.append(await producer.send(topic, orjson.dumps(trace), key=f"t-{n}".encode(),
                                             timestamp_ms=int(at.timestamp() * 1000)))
        await asyncio.gather(*sends)
    finally:
        await producer.stop()


async def a_lease_holder_once_under_way(redis: Any, judge: JudgeServer, job_id: str,
                                        workers: list[WorkerProcess]) -> WorkerProcess:
    """A worker that holds one of the job's partitions, once a tenth of the judge calls are made."""
    by_pid = {w.proc.pid: w for w in workers if w.proc is not None}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(judge.requests) >= TRACES // 10:
            for partition in range(PARTITIONS):
                holder = await redis.get(keys.backfill_lease(job_id, partition))
                pid = int((holder.decode() if isinstance(holder, bytes) else holder).rsplit("-", 1)[1]) \
                    if holder else None
                if pid in by_pid:
                    return by_pid[pid]
        await asyncio.sleep(0.05)
    raise AssertionError(f"the job was not under way with a partition leased in time ({len(judge.requests)} calls)")
