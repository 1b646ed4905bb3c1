"""Benchmark of the webhook sender: deliveries per second to healthy channels, and how long a
delivery takes from the webhooks topic to the receiver, while a dead and a slow channel of the
same agent get the same load.

    .venv/bin/python -m tests.bench.bench_webhooks [--deliveries 2000] [--channels 4] [--slow-s 10] [--no-bad]

Starts its own Kafka and Redis (or uses SGW_KAFKA_BOOTSTRAP / SGW_REDIS_URL), local receivers on
127.0.0.1 (healthy ones answer 200 at once; the slow one after ``--slow-s``; the dead one is a
port nobody listens on), produces every delivery at once onto the webhooks topic of a running
worker, and prints figures; it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

from redis.asyncio import Redis

from devtools.processes import free_port
from devtools.redis_servers import LocalRedis
from devtools.services import LocalKafka
from scoring.results import Signal, build_deliveries
from services.groups import MonitorClient
from tests.support.harness import WorkerProcess, produce, worker_env
from tests.support.http_fakes import Reply, ScriptedServer


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
        if not redis_url:
            local_redis = LocalRedis().start()
            stack.callback(local_redis.stop)
            redis_url = local_redis.url
        healthy = [stack.enter_context(ScriptedServer(default=Reply(body={"ok": True}))) for _ in range(args.channels)]
        slow = stack.enter_context(ScriptedServer(default=Reply(body={"ok": True}, delay_s=args.slow_s)))
        dead_url = f"http://127.0.0.1:{free_port()}/hook"
        urls = [h.url + "/hook" for h in healthy] + ([slow.url + "/hook", dead_url] if args.bad else [])
        redis = Redis.from_url(redis_url)
        await redis.flushdb()
        await MonitorClient(redis).apply({"channels": [{"agentId": "bench", "url": u} for u in urls]})
        await redis.aclose()
        env = worker_env(bootstrap, redis_url, f"hooks-bench-{int(time.time())}", log_level="warning",
                         egress_allow="127.0.0.0/8", webhook_timeout_s=args.slow_s + 5)
        worker = WorkerProcess(env, name="bench").start(Path(tempfile.mkdtemp(prefix="sgw-bench-")))
        try:
            worker.wait_ready()
            per_channel = args.deliveries // args.channels
            deliveries = []
            for n in range(per_channel):
                signal = Signal(id=f"sig-{n}", key="scorer-group:g", group_id="g", group_name="G", project_id="p",
                                agent_id="bench", scope="trace", trace_id=f"t-{n}", rating=1.0, alert_threshold=5.0,
                                severity="low", justification="bench", rating_id=f"r-{n}",
                                raised_at=datetime.now(UTC))
                deliveries += build_deliveries(signal, urls)
            print(f"{per_channel * args.channels} deliveries to {args.channels} healthy channels"
                  + (f", {per_channel} each to a slow ({args.slow_s:g}s) and a dead channel" if args.bad else ""))
            started = time.time()
            await produce(bootstrap, env["SGW_WEBHOOKS_TOPIC"], [(b"bench", d.to_json()) for d in deliveries])
            produced = time.time()
            deadline = time.monotonic() + 300
            while sum(len(h.requests) for h in healthy) < per_channel * args.channels and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            arrivals = sorted(r.at for h in healthy for r in h.requests)
            span = arrivals[-1] - arrivals[0]
            latencies = [(a - started) * 1000 for a in arrivals]
            print(f"  produced in {produced - started:.2f}s; healthy deliveries: {len(arrivals)} in {span:.2f}s -> "
                  f"{len(arrivals) / max(span, 1e-9):,.0f}/s")
            print(f"  produce start -> receiver ms: p50 {pct(latencies, .5):.0f}, p95 {pct(latencies, .95):.0f}, "
                  f"max {max(latencies):.0f}; slow channel answered {len(slow.requests)} so far")
        finally:
            worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=2000)
    parser.add_argument("--channels", type=int, default=4)
    parser.add_argument("--slow-s", type=float, default=10.0)
    parser.add_argument("--no-bad", dest="bad", action="store_false", help="healthy channels only (baseline)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
