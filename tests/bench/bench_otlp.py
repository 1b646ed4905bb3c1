"""Benchmark of OpenTelemetry assembly: spans per second assembled and the latency it adds.

    .venv/bin/python -m tests.bench.bench_otlp [--traces 5000] [--rate 200] [--seconds 15] [--quiet 0.5]

Starts its own Kafka and Redis (or uses SGW_KAFKA_BOOTSTRAP / SGW_REDIS_URL) and runs the real
worker with the OTLP intake on. Each trace is four GenAI-conventions spans (invoke_agent, chat,
execute_tool, chat) written as the Collector's Kafka exporter writes them (``otlp_proto``, one
request per trace keyed by its id). Two phases:

1. backlog: ``--traces`` traces are produced first, then the worker starts; throughput is spans
   of the assembled traces per second, from the first assembled trace on the traces topic to
   the last;
2. steady: traces at ``--rate`` per second for ``--seconds``; the added latency is the assembled
   trace's record time minus its span record's time, less the ``--quiet`` window every trace
   waits by design, as p50 / p95 / p99 / max.

It prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import orjson
from aiokafka import AIOKafkaProducer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from redis.asyncio import Redis

from devtools.redis_servers import LocalRedis
from devtools.services import LocalKafka
from tests.bench.bench_live import collect, pct, rss_mib
from tests.support.harness import WorkerProcess, worker_env
from tests.support.redis_guard import refuse_foreign_keys

SPANS_PER_TRACE = 4


def kv(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def request(n: int) -> tuple[bytes, bytes]:
    """One trace's request (key, value), as the exporter writes it with partition_traces_by_id."""
    trace_id = (n + 1).to_bytes(16, "big")
    now = time.time_ns()
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend([kv("service.name", "bench-bot"), kv("sgw.project.id", "bench")])
    scope = rs.scope_spans.add()
    root_id = (n * 8 + 1).to_bytes(8, "big")

    def add(i: int, name: str, parent: bytes, **attrs: str) -> None:
        span = Span(trace_id=trace_id, span_id=(n * 8 + 1 + i).to_bytes(8, "big"), parent_span_id=parent, name=name,
                    start_time_unix_nano=now + i * 1000, end_time_unix_nano=now + i * 1000 + 500)
        span.attributes.extend(kv(k.replace("__", "."), v) for k, v in attrs.items())
        scope.spans.append(span)

    messages = '[{"role":"assistant","parts":[{"type":"text","content":"Your refund is on its way."}]}]'
    add(0, "invoke_agent", b"", gen_ai__operation__name="invoke_agent", gen_ai__agent__name="bench")
    add(1, "chat", root_id, gen_ai__operation__name="chat", gen_ai__output__messages=messages,
        gen_ai__input__messages=f'[{{"role":"user","parts":[{{"type":"text","content":"Refund for {n}?"}}]}}]')
    add(2, "execute_tool lookup", root_id, gen_ai__operation__name="execute_tool", gen_ai__tool__call__result="ok")
    add(3, "chat", root_id, gen_ai__operation__name="chat", gen_ai__output__messages=messages)
    return trace_id.hex().encode(), req.SerializeToString()


async def produce(bootstrap: str, topic: str, first: int, count: int, rate: float | None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5, max_batch_size=65536)
    await producer.start()
    try:
        started = time.monotonic()
        acks = []
        for n in range(first, first + count):
            key, value = request(n)
            acks.append(await producer.send(topic, key=key, value=value))
            if rate is not None and n % 20 == 0:
                lag = (n - first) / rate - (time.monotonic() - started)
                if lag > 0:
                    await asyncio.sleep(lag)
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


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
        await redis.aclose()
        tag = f"bench-otlp-{int(time.time())}"
        env = worker_env(bootstrap, redis_url, tag, topic_partitions=6, log_level="warning", otlp_enabled="true",
                         otlp_topic=f"otlp-{tag}", otlp_quiet_s=args.quiet, otlp_flush_interval_s=0.1)
        logs = Path(tempfile.mkdtemp(prefix="sgw-bench-otlp-"))
        warm = WorkerProcess(env, name="create-topics").start(logs)  # the worker creates the topics
        warm.wait_ready()
        warm.stop()

        print(f"phase 1: backlog of {args.traces} traces x {SPANS_PER_TRACE} spans")
        await produce(bootstrap, env["SGW_OTLP_TOPIC"], 0, args.traces, rate=None)
        worker = WorkerProcess(env, name="bench").start(logs)
        try:
            assembled = await collect(bootstrap, env["SGW_TRACES_TOPIC"], args.traces, 600)
            times = [r.timestamp for r in assembled]
            span_s = max(0.001, (max(times) - min(times)) / 1000)
            print(f"  assembled: {len(assembled)} traces in {span_s:.2f}s -> "
                  f"{len(assembled) * SPANS_PER_TRACE / span_s:,.0f} spans/s, {len(assembled) / span_s:,.0f} traces/s")

            print(f"phase 2: steady {args.rate:g} traces/s for {args.seconds:g}s (quiet window {args.quiet:g}s)")
            count = int(args.rate * args.seconds)
            await produce(bootstrap, env["SGW_OTLP_TOPIC"], args.traces, count, rate=args.rate)
            everything = await collect(bootstrap, env["SGW_TRACES_TOPIC"], args.traces + count, 300)
            sent = {r.key: r.timestamp for r in await collect(bootstrap, env["SGW_OTLP_TOPIC"], args.traces + count, 120)}
            added = []
            for r in everything:
                trace_id = orjson.loads(r.value)["traceId"].encode()
                if int(trace_id, 16) > args.traces:
                    added.append(r.timestamp - sent[trace_id] - args.quiet * 1000)
            print(f"  traces: {len(added)}; added latency beyond the quiet window, ms: p50 {pct(added, .5):.0f}, "
                  f"p95 {pct(added, .95):.0f}, p99 {pct(added, .99):.0f}, max {max(added):.0f}")
            print(f"  worker rss: {rss_mib(worker):.0f} MiB")
        finally:
            worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=5_000)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--quiet", type=float, default=0.5)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
