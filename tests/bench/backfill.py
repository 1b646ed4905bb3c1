"""The backfill scenario: a group's past traffic graded again - how fast, beside live
scoring, and what a running job costs live latency.

- backfill_live: ``--backfill-traces`` traces on a topic of their own, at record timestamps an
  hour back (a millisecond apart), drained live by a worker with the deterministic groups;
- backfill: the same traces graded again by one job per group (``BackfillStore.create`` over
  their window, as ``POST /v1/scorer-groups/{id}/backfills`` does) in a fresh worker whose
  consumer group is committed at the topic's end (nothing live to do) and with a Redis database
  of its own (no done marks). traces/s counts the ratings (all of origin "backfill") by broker
  timestamp from the first to the last, like every scenario; ``job_traces_per_s`` from the jobs'
  creation to the last one done (planning and the runner's 2 s tick included); ``vs_live`` and
  ``job_vs_live`` are those over backfill_live's traces/s; ``groups``: each group's ratings from
  its first to its last (each job's own rate while the runner grades one job at a time);
- backfill_latency: the latency scenario twice at one rate (``--latency-rate``, by default half
  the deterministic rate, else half backfill_live's): alone, and with ``--backfill-backlog``
  past traces (by default what the backfill above grades in twice the window) behind the live
  consumer group's offsets and a job per group over them, started with the worker: p50 / p99 /
  max of each, and the jobs' progress when production starts and when it ends.

Each group's job reads the topic once (live reads it once for every group), and only while the
live loop is not pressed (``TraceConsumer.pressed``). A runner that publishes no rating within
``FIRST_RATING_S`` ends the scenario with what its jobs and the worker's log say.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from adapters.stores.backfills import BackfillStore
from scorer_groups.api_models import BACKFILL_ENDED, BackfillCreate, BackfillJob
from tests.bench import scenarios
from tests.bench.scenarios import Bench
from tests.bench.workload import (
    DETERMINISTIC_CATALOG,
    DETERMINISTIC_GROUPS,
    PARTITIONS,
    OutputTopic,
    create_topics,
    produce_traces,
)

HOUR_MS = 3_600_000
FIRST_RATING_S = 120.0  # a job planned and its first chunk out: a runner silent this long grades nothing
Window = tuple[int, int]  # [from, to) in epoch milliseconds


async def past_traces(bench: Bench, what: str, count: int, *, hours_back: int = 1) -> tuple[str, Window]:
    """A topic of its own with ``count`` traces at record timestamps ``hours_back`` hours ago, a
    millisecond apart; the topic and the window that holds them all."""
    topic = bench.name(what)
    await create_topics(bench.bootstrap, [topic])
    return topic, await _fill_past(bench, topic, count, hours_back)


async def _fill_past(bench: Bench, topic: str, count: int, hours_back: int) -> Window:
    first_ms = int(time.time() * 1000) - hours_back * HOUR_MS
    await produce_traces(bench.bootstrap, topic, 0, count, timestamp_ms=lambda n: first_ms + n)
    return first_ms, first_ms + count


async def _commit_at_end(bench: Bench, topic: str, group_id: str) -> None:
    """The consumer group's offsets at the topic's end: its live loop starts past the backlog."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bench.bootstrap, group_id=group_id, enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        await consumer.commit(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


async def _start_jobs(redis_url: str, window: Window) -> list[str]:
    """One job per deterministic group over ``window``, at the group's sample rate."""
    request = BackfillCreate.model_validate({"from": datetime.fromtimestamp(window[0] / 1000, UTC).isoformat(),
                                             "to": datetime.fromtimestamp(window[1] / 1000, UTC).isoformat()})
    redis = Redis.from_url(redis_url)
    try:
        store = BackfillStore(redis)
        return [(await store.create(g["id"], g["projectId"], request, g["online"]["sampleRate"])).id
                for g in DETERMINISTIC_CATALOG["groups"]]
    finally:
        await redis.aclose()


async def _jobs(redis_url: str, ids: list[str]) -> list[BackfillJob]:
    redis = Redis.from_url(redis_url)
    try:
        store = BackfillStore(redis)
        return [await store.get(job_id) for job_id in ids]
    finally:
        await redis.aclose()


def _progress(jobs: list[BackfillJob]) -> dict[str, Any]:
    """The jobs' progress summed (each job reads the whole window: its fraction is the mean)."""
    return {"statuses": [j.status for j in jobs],
            "fraction": round(sum(j.progress.fraction for j in jobs) / len(jobs), 4),
            "tracesRead": sum(j.progress.traces_read for j in jobs),
            "pairsScored": sum(j.progress.pairs_scored for j in jobs),
            "pairsSkipped": sum(j.progress.pairs_skipped for j in jobs)}


async def live(bench: Bench, topic: str, traces: int) -> dict[str, Any]:
    """The traces drained live, as the deterministic scenario drains its topic."""
    return await scenarios._worker_drain(bench, "backfill-live", traces, topic=topic)


async def backfill(bench: Bench, topic: str, window: Window, traces: int) -> dict[str, Any]:
    """The same traces graded again by a job per group, nothing live to do."""
    redis_url = await bench.fresh_db(DETERMINISTIC_CATALOG)
    ratings = bench.name("backfill-ratings")
    await create_topics(bench.bootstrap, [ratings], log_append_time=True)
    await _commit_at_end(bench, topic, bench.group("backfill"))
    worker = bench.worker("backfill", redis_url, topic=topic, ratings_topic=ratings)
    proc = worker.proc
    assert proc is not None
    try:
        await asyncio.to_thread(worker.wait_ready, 90)
        ids = await _start_jobs(redis_url, window)
        async with OutputTopic(bench.bootstrap, ratings) as out:  # a runner that grades nothing ends here
            deadline = time.monotonic() + FIRST_RATING_S
            while await out.count() == 0 and proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.25)
            first = await out.count()
        result: dict[str, Any] = {"traces": 0, "complete": False}
        if first:
            result = await scenarios._drain(bench, proc.pid, lambda: proc.poll() is None, ratings, traces,
                                            DETERMINISTIC_GROUPS, redis_url)
        deadline = time.monotonic() + 30  # the last batch is out: the runner says done within its tick
        jobs = await _jobs(redis_url, ids)
        while first and any(j.status not in BACKFILL_ENDED for j in jobs) and time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            jobs = await _jobs(redis_url, ids)
        groups = await _by_group(bench, ratings)
    finally:
        worker.stop(timeout_s=120)
    errors = [line for line in worker.logs(whole=True).splitlines() if '"level": "error"' in line]
    if not first:
        print(f"  !! no rating in {FIRST_RATING_S:g} s; jobs {[(j.status, j.error) for j in jobs]}; "
              f"{len(errors)} errors logged (see {bench.logs})", flush=True)
    elif all(j.status == "done" for j in jobs):
        job_s = (max(j.updated_at for j in jobs) - min(j.created_at for j in jobs)).total_seconds()
        result |= {"job_seconds": round(job_s, 2), "job_traces_per_s": round(traces / job_s, 1)}
    else:
        print(f"  !! jobs not done: {[(j.id, j.status, j.progress.fraction) for j in jobs]} (see {bench.logs})",
              flush=True)
    return result | {"groups": groups, "worker_errors": len(errors), "jobs": [
        {"group": j.group_id, "status": j.status, "seconds": round((j.updated_at - j.created_at).total_seconds(), 2),
         **j.progress.model_dump(by_alias=True), **({"error": j.error} if j.error else {}),
         **({"notes": j.notes} if j.notes else {})} for j in jobs]}


async def _by_group(bench: Bench, topic: str) -> dict[str, dict[str, Any]]:
    """Per group: its ratings, their origins, and traces/s from its first to its last by broker
    timestamp (while the runner grades one job at a time, each job's own rate)."""
    async with OutputTopic(bench.bootstrap, topic) as out:
        records = await out.records()
    seen: dict[str, tuple[int, int, int, set[str]]] = {}
    for record in records:
        doc = orjson.loads(record.value)
        count, first, last, origins = seen.get(doc["groupId"], (0, record.timestamp, record.timestamp, set()))
        seen[doc["groupId"]] = (count + 1, min(first, record.timestamp), max(last, record.timestamp),
                                origins | {str(doc.get("origin"))})
    return {group: {"ratings": count, "seconds": round((last - first) / 1000, 2),
                    "traces_per_s": round(count / max(0.001, (last - first) / 1000), 1), "origins": sorted(origins)}
            for group, (count, first, last, origins) in sorted(seen.items())}


def backlog_for(backfill_traces_per_s: float | None, seconds: float, floor: int) -> int:
    """A backlog the job does not finish while the latency window runs: what the unhindered
    backfill grades in twice the window and the worker's start."""
    if not backfill_traces_per_s:
        return floor
    return max(floor, int(backfill_traces_per_s * (seconds + 10) * 2))


async def latency(bench: Bench, rate: float, seconds: float, backlog: int) -> dict[str, Any]:
    """The latency scenario alone, then with a job per group over a past backlog in the same
    worker's topic."""
    alone = await scenarios.latency(bench, rate, seconds, name="backfill-latency-alone")
    ids: list[str] = []
    db: list[str] = []
    samples: list[tuple[float, dict[str, Any]]] = []

    async def prepare(topic: str, redis_url: str, group_id: str) -> None:
        print(f"  filling {backlog:,} past traces behind the live loop's offsets", flush=True)
        window = await _fill_past(bench, topic, backlog, hours_back=2)
        await _commit_at_end(bench, topic, group_id)
        ids.extend(await _start_jobs(redis_url, window))
        db.append(redis_url)

    async def progress() -> dict[str, Any]:
        now = _progress(await _jobs(db[0], ids))
        samples.append((time.monotonic(), now))
        return now

    loaded = await scenarios.latency(bench, rate, seconds, name="backfill-latency-job", prepare=prepare,
                                     progress=progress)
    (t1, start), (t2, end) = samples[0], samples[-1]
    during_s = max(0.001, t2 - t1)
    running = all(s not in BACKFILL_ENDED for s in end["statuses"])
    if not running:
        print(f"  !! a job ended before the live window did ({end['statuses']}): a larger --backfill-backlog",
              flush=True)
    return {"rate": alone["rate"], "achieved_rate": loaded["achieved_rate"], "traces": loaded["traces"],
            "backlog": backlog, "p50_ms_alone": alone["p50_ms"], "p99_ms_alone": alone["p99_ms"],
            "max_ms_alone": alone["max_ms"], "p50_ms_with_job": loaded["p50_ms"], "p99_ms_with_job": loaded["p99_ms"],
            "max_ms_with_job": loaded["max_ms"],
            "p99_with_job_vs_alone": round(loaded["p99_ms"] / max(1, alone["p99_ms"]), 2),
            "job_running_throughout": running,
            # pairs graded while live ran, per group: traces/s, like the backfill scenario's figure
            "backfill_traces_per_s_during": round((end["pairsScored"] - start["pairsScored"])
                                                  / DETERMINISTIC_GROUPS / during_s, 1),
            "progress": loaded.get("progress"), "alone": alone,
            "with_job": {k: v for k, v in loaded.items() if k != "progress"}}
