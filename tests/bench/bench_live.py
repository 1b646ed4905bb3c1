"""Benchmark of the live pipeline: traces per second and ingest→rating latency.

    .venv/bin/python -m tests.bench.bench_live [--traces 20000] [--rate 400] [--seconds 20]

Starts its own Kafka and Redis (or uses SGW_KAFKA_BOOTSTRAP / SGW_REDIS_URL), applies a
deterministic-only group set (patterns and a code scorer: no judge latency in the figures), and
runs the real worker as a subprocess in two phases:

1. backlog: ``--traces`` traces are produced first, then the worker starts; throughput is
   ratings published per second from the first rating to the last;
2. steady: traces are produced at ``--rate`` per second for ``--seconds``; latency is the
   rating record's timestamp minus its trace record's timestamp (both producer CreateTime on
   this machine), reported as p50 / p95 / p99 / max.

It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from devtools.redis_servers import LocalRedis
from devtools.services import LocalKafka
from services.groups import MonitorClient
from tests.support.harness import WorkerProcess, worker_env
from tests.support.redis_guard import refuse_foreign_keys

CATALOG = {
    "patterns": [
        {"id": "email", "name": "Email", "polarity": "failure", "template": "email"},
        {"id": "card", "name": "Card", "polarity": "failure", "template": "credit_card"},
        {"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology"},
        {"id": "refund", "name": "Refund", "polarity": "proper", "contains": ["refund", "return label"]},
    ],
    "customs": [{"id": "length", "name": "Length", "type": "code",
                 "code": "def score(i, o, e, s, m):\n    return min(1.0, len(o) / 200)\n"}],
    "groups": [
        {"id": "patterns", "name": "Patterns", "projectId": "bench",
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"},
         "members": [{"kind": "pattern", "refId": "email", "weight": 0, "gate": True},
                     {"kind": "pattern", "refId": "card", "weight": 0, "gate": True},
                     {"kind": "pattern", "refId": "apology", "weight": 1, "gate": False},
                     {"kind": "pattern", "refId": "refund", "weight": 1, "gate": False}]},
        {"id": "code", "name": "Code", "projectId": "bench",
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 3, "severity": "low"},
         "members": [{"kind": "custom", "refId": "length", "weight": 1, "gate": False},
                     {"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]},
    ],
}
GROUPS = len(CATALOG["groups"])


def trace(n: int) -> bytes:
    answer = ("I'm sorry about that. " if n % 5 == 0 else "") + "You can print a return label " \
        "from your account page; the refund arrives within five days." + (" x" * (n % 50))
    return orjson.dumps({
        "traceId": f"b-{n}", "projectId": "bench", "agentId": "bench-agent",
        "timestamp": "2026-12-02T13:00:00Z",
        "spans": [{"spanId": "r", "name": "agent.run", "input": f"Where is my refund for order {n}?",
                   "output": answer},
                  {"spanId": "c", "parentSpanId": "r", "kind": "llm", "input": "...", "output": answer}]})


async def produce(bootstrap: str, topic: str, first: int, count: int, rate: float | None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=65536)
    await producer.start()
    try:
        started = time.monotonic()
        acks = []
        for n in range(first, first + count):
            acks.append(await producer.send(topic, key=f"b-{n}".encode(), value=trace(n)))
            if rate is not None and n % 20 == 0:
                lag = (n - first) / rate - (time.monotonic() - started)
                if lag > 0:
                    await asyncio.sleep(lag)
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


async def collect(bootstrap: str, topic: str, expected: int, timeout_s: float) -> list[Any]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=None, enable_auto_commit=False)
    await consumer.start()
    out: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200, max_records=5000)).values():
                out.extend(records)
    finally:
        await consumer.stop()
    return out


async def trace_timestamps(bootstrap: str, topic: str, expected: int) -> dict[str, int]:
    return {r.key.decode(): r.timestamp for r in await collect(bootstrap, topic, expected, 120)}


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1] if len(values) > 1 else values[0]


async def run(args: argparse.Namespace) -> None:
    with ExitStack() as stack:
        bootstrap = os.environ.get("SGW_KAFKA_BOOTSTRAP")
        redis_url = os.environ.get("SGW_REDIS_URL")
        if not bootstrap:
            kafka = LocalKafka().start()
            stack.callback(kafka.stop)
            bootstrap = kafka.bootstrap
        if redis_url:
            refuse_foreign_keys(redis_url)  # it is emptied below
        else:
            local_redis = LocalRedis().start()
            stack.callback(local_redis.stop)
            redis_url = local_redis.url
        redis = Redis.from_url(redis_url)
        await redis.flushdb()
        await MonitorClient(redis).apply(CATALOG)
        await redis.aclose()
        tag = f"{int(time.time())}"
        env = worker_env(bootstrap, redis_url, f"bench-{tag}", topic_partitions=6,
                         code_sandboxes=args.sandboxes)
        logs = Path(tempfile.mkdtemp(prefix="sgw-bench-"))

        # Topics exist before the backlog is produced: the worker creates them at start.
        warm = WorkerProcess(env, name="create-topics").start(logs)
        warm.wait_ready()
        warm.stop()

        print(f"phase 1: backlog of {args.traces} traces x {GROUPS} groups")
        await produce(bootstrap, env["SGW_TRACES_TOPIC"], 0, args.traces, rate=None)
        worker = WorkerProcess(env, name="bench").start(logs)
        try:
            ratings = await collect(bootstrap, env["SGW_RATINGS_TOPIC"], args.traces * GROUPS, 600)
            times = [r.timestamp for r in ratings]
            span_s = (max(times) - min(times)) / 1000
            print(f"  ratings published: {len(ratings)} in {span_s:.2f}s -> "
                  f"{len(ratings) / span_s:,.0f} ratings/s, {len(ratings) / GROUPS / span_s:,.0f} traces/s")

            print(f"phase 2: steady {args.rate:g} traces/s for {args.seconds:g}s")
            count = int(args.rate * args.seconds)
            await produce(bootstrap, env["SGW_TRACES_TOPIC"], args.traces, count, rate=args.rate)
            all_ratings = await collect(bootstrap, env["SGW_RATINGS_TOPIC"], (args.traces + count) * GROUPS, 300)
            sent = await trace_timestamps(bootstrap, env["SGW_TRACES_TOPIC"], args.traces + count)
            latencies = []
            for r in all_ratings:
                v = orjson.loads(r.value)
                n = int(v["traceId"].split("-")[1])
                if n >= args.traces:
                    latencies.append(r.timestamp - sent[v["traceId"]])
            print(f"  ratings: {len(latencies)}; ingest->rating latency ms: p50 {pct(latencies, .5):.0f}, "
                  f"p95 {pct(latencies, .95):.0f}, p99 {pct(latencies, .99):.0f}, max {max(latencies):.0f}")
            print(f"  worker rss: {rss_mib(worker):.0f} MiB")
        finally:
            worker.stop()


def rss_mib(worker: WorkerProcess) -> float:
    assert worker.proc is not None
    for line in Path(f"/proc/{worker.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=400)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--sandboxes", type=int, default=2)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
