"""The verdict-cache scenario: what paying once for the same verdict saves, measured in
one run against the same worker and judge otherwise.

    .venv/bin/python -m tests.bench.suite --only verdict-cache [--cache-traces 3000]

The judge-bound scenario's group (one judge: one call per trace) at SGW_JUDGE_CONCURRENCY 64,
against devtools/judge_server.py in its own process (``JudgeProcess``, 300 ms a call), drains the
same number of the workload's ~2 KB traces three times, each from a topic of its own into a
fresh Redis database:

1. ``unique``: every trace asks its own question (the workload's traces: order numbers differ) -
   every pair a judge pair;
2. ``mix``: 30% of the traces repeat one of ``FAQ`` questions and answers word for word (an FAQ
   bot's traffic), the rest as in 1;
3. ``repeated``: every trace repeats one of the ``FAQ`` - after the first of each, every pair is a
   cached pair.

Per variant: judge calls per trace (counted by the judge server), the worker's CPU per trace
(``scenarios._drain``: from the first rating on, the process and its children) and the Redis
commands per pair (``INFO commandstats``). ``calls_saved`` is the mix's judge calls per trace
under the unique run's; ``cached_vs_judge_cpu`` is a cached pair's CPU over a judge pair's
(``repeated`` over ``unique``).

4. ``redis_bytes_per_entry``: ``VerdictStore.store`` of ``MEMORY_ENTRIES`` verdicts (a
   100-character justification, a rating id, a usage) into a fresh database of the suite's Redis,
   nothing else writing meanwhile: ``used_memory`` after over before, per entry.

Prints the figures; asserts nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from adapters.stores.verdicts import Paid, VerdictStore
from scoring.ports import TokenUsage
from scoring.verdict_cache import BUCKETS_READ, CachedVerdict, CachePolicy, verdict_key
from tests.bench import scenarios
from tests.bench.scenarios import JUDGE_LATENCY_S, Bench, JudgeProcess
from tests.bench.workload import JUDGE_CATALOG, create_topics, trace_value

JUDGE_CONCURRENCY = 64
FAQ = 20  # distinct repeated questions and answers
FAQ_BASE = 1_000_000  # the workload trace numbers the FAQ's traces copy
VARIANTS = {"unique": 0.0, "mix": 0.3, "repeated": 1.0}


def cache_trace(n: int, repeated: float) -> bytes:
    """Trace ``n``: with probability ``repeated`` (every ``n`` whose tenth part falls under it) a
    copy of one of the FAQ traces under its own id, else the workload's own trace ``n``."""
    if (n % 10) < repeated * 10:
        document = orjson.loads(trace_value(FAQ_BASE + n % FAQ))
        document["traceId"] = f"t-{n}"
        return orjson.dumps(document)
    return trace_value(n)


async def _produce(bench: Bench, topic: str, traces: int, repeated: float) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bench.bootstrap, linger_ms=20, max_batch_size=1 << 20, acks=1)
    await producer.start()
    try:
        acks = []
        for n in range(traces):
            acks.append(await producer.send(topic, key=f"t-{n}".encode(), value=cache_trace(n, repeated)))
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


MEMORY_ENTRIES = 200_000
JUSTIFICATION = "The answer addresses the question directly and cites the order status; it could be more concise."


async def redis_bytes_per_entry(bench: Bench) -> float:
    redis = Redis.from_url(await bench.fresh_db({}))
    try:
        store = VerdictStore(redis, CachePolicy(max_entries=BUCKETS_READ * MEMORY_ENTRIES))
        before = (await redis.info("memory"))["used_memory"]
        for start in range(0, MEMORY_ENTRIES, 500):
            await store.store([Paid("p-memory", verdict_key("p-memory", "judge", "gpt-4o-mini",
                                                            [{"role": "user", "content": str(n)}]),
                                    CachedVerdict(7.0, JUSTIFICATION, str(uuid.uuid4()), TokenUsage(850, 60)))
                               for n in range(start, start + 500)])
        used = (await redis.info("memory"))["used_memory"] - before
        assert await store.entries("p-memory") == MEMORY_ENTRIES
        await redis.flushdb()
    finally:
        await redis.aclose()
    return round(float(used) / MEMORY_ENTRIES, 1)


async def verdict_cache(bench: Bench, traces: int) -> dict[str, Any]:
    judge = JudgeProcess(bench, JUDGE_LATENCY_S)
    result: dict[str, Any] = {"traces": traces, "faq": FAQ, "judge_concurrency": JUDGE_CONCURRENCY}
    try:
        for name, repeated in VARIANTS.items():
            topic, ratings = bench.name(f"cache-{name}-traces"), bench.name(f"cache-{name}-ratings")
            await create_topics(bench.bootstrap, [topic])
            await create_topics(bench.bootstrap, [ratings], log_append_time=True)
            await _produce(bench, topic, traces, repeated)
            redis_url = await bench.fresh_db(JUDGE_CATALOG)
            await asyncio.sleep(0.6)  # the judge process prints its count every 0.25 s
            calls_before = judge.count[1]
            worker = bench.worker(f"cache-{name}", redis_url, topic=topic, ratings_topic=ratings,
                                  judge_base_url=judge.base_url, judge_concurrency=JUDGE_CONCURRENCY)
            proc = worker.proc
            assert proc is not None
            try:
                drained = await scenarios._drain(bench, proc.pid, lambda p=proc: p.poll() is None,
                                                 ratings, traces, 1, redis_url)
            finally:
                worker.stop(timeout_s=120)
            await asyncio.sleep(0.6)
            calls = judge.count[1] - calls_before
            result[name] = {"repeated": repeated, "judge_calls": calls, "judge_calls_per_trace": round(calls / traces, 3),
                            "cpu_s_per_1k": drained["cpu_s_per_1k"], "traces_per_s": drained["traces_per_s"],
                            "redis_cmds_per_pair": drained.get("redis_cmds_per_pair"),
                            "redis_cmds_per_judge_call": round(drained.get("redis_cmds_per_pair", 0) / max(
                                1e-9, calls / traces), 3) if calls else None,
                            "complete": drained["complete"]}
    finally:
        judge.stop()
    unique, mix, repeated_run = result["unique"], result["mix"], result["repeated"]
    if unique["judge_calls_per_trace"]:
        result["calls_saved"] = round(1 - mix["judge_calls_per_trace"] / unique["judge_calls_per_trace"], 3)
    if unique["cpu_s_per_1k"]:
        result["cached_vs_judge_cpu"] = round(repeated_run["cpu_s_per_1k"] / unique["cpu_s_per_1k"], 3)
    result["redis_bytes_per_entry"] = await redis_bytes_per_entry(bench)
    return result
