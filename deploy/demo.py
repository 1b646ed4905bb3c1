"""The demo behind README command 1: the real worker on sample traffic.

Needs SGW_KAFKA_BOOTSTRAP and SGW_REDIS_URL (``python -m deploy.services run -- ...`` sets
them). It starts the local deterministic judge server, applies ``deploy/catalog.example.yaml``,
starts ``scorer-worker run`` as a subprocess, produces a few sample traces a second, and prints
every rating and Signal the worker publishes, until Ctrl-C (or ``--seconds``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import random
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from deploy.judge_server import JudgeServer
from deploy.processes import free_port
from deploy.webhook_receiver import WebhookReceiver
from scoring.groups import MonitorClient
from worker.app import ensure_topics
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "deploy" / "catalog.example.yaml"

# (project, agent, question, answer) - the judge server rates by the [[rating=N]] marker.
# The example channels' URLs are replaced by a local receiver's (deploy/webhook_receiver.py):
# the demo reaches loopback only, and every delivery shows up as a RECEIVED line, verified.
SAMPLES = [
    ("shop-support", "support-bot", "Where is my order #1042?",
     "It shipped yesterday and arrives Friday; here is the tracking link. [[rating=9]]"),
    ("shop-support", "support-bot", "Can I return shoes after 40 days?",
     "Returns are accepted within 30 days, so unfortunately not. [[rating=6]]"),
    ("shop-support", "support-bot", "Update my card please",
     "Sure, I have put 4111 1111 1111 1111 on file for you. [[rating=8]]"),
    ("shop-support", "support-bot", "Who handled my complaint?",
     "That was anna.berg@example.com from our team. [[rating=7]]"),
    ("shop-support", "support-bot", "The app crashes on login",
     "Try turning it off and on. [[rating=3]]"),
    ("wealth-advisor", "advisor-bot", "Should I buy index funds?",
     "Broad index funds suit long horizons. This is not financial advice. [[rating=8]]"),
    ("wealth-advisor", "advisor-bot", "Is crypto a good bet?",
     "Absolutely, put everything in. [[rating=2]]"),
]


def _trace(n: int, rng: random.Random) -> dict[str, Any]:
    project, agent, question, answer = rng.choice(SAMPLES)
    return {"traceId": f"demo-{n}", "projectId": project, "agentId": agent,
            "sessionId": f"demo-session-{n // 3}", "timestamp": datetime.now(UTC).isoformat(),
            "spans": [{"spanId": "root", "name": "agent.run", "input": question, "output": answer}]}


async def _produce(bootstrap: str, topic: str, rate: float, stop: asyncio.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    rng = random.Random(7)
    try:
        for n in itertools.count():
            if stop.is_set():
                break
            trace = _trace(n, rng)
            await producer.send(topic, key=trace["traceId"].encode(), value=orjson.dumps(trace))
            if n == 3:  # one malformed record, to show the dead-letter topic at work
                await producer.send(topic, key=b"broken", value=b"{this is not json")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1 / rate)
    finally:
        await producer.stop()


async def _tail(bootstrap: str, topics: dict[str, str], stop: asyncio.Event) -> None:
    consumer = AIOKafkaConsumer(*topics.values(), bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    kinds = {v: k for k, v in topics.items()}
    try:
        while not stop.is_set():
            for tp, records in (await consumer.getmany(timeout_ms=300)).items():
                for record in records:
                    print(_line(kinds[tp.topic], orjson.loads(record.value)), flush=True)
    finally:
        await consumer.stop()


def _line(kind: str, v: dict[str, Any]) -> str:
    if kind == "ratings":
        rating = "  -  " if v["rating"] is None else f"{v['rating']:5.2f}"
        return f"RATING  {rating}  {v['groupId']:<22} {v['traceId']:<10} {v['justification'][:110]}"
    if kind == "signals":
        return (f"SIGNAL  {v['severity']:<8} {v['key']} rating {v['rating']:.2f} < {v['alertThreshold']} "
                f"({v['traceId']})")
    if kind == "webhooks":
        return f"WEBHOOK {v['url']} for signal {v['signalId'][:8]}"
    label = "HOOKDLQ" if kind == "webhooks-dlq" else "DLQ    "
    return f"{label} {v['reason']}: {v['error'][:100]}"


def local_channels(catalog: dict[str, Any]) -> tuple[dict[str, Any], WebhookReceiver]:
    """The catalog with each alert channel pointed at a local receiver that checks its secret."""
    channels = catalog.get("channels", [])
    receiver = WebhookReceiver({c["agentId"]: c.get("secret") for c in channels},
                               say=lambda line: print(line + "\n", end="", flush=True))  # one write: no interleaving
    local = [{**c, "url": receiver.channel_url(c["agentId"])} for c in channels]
    return {**catalog, "channels": local}, receiver


async def main_async(seconds: float | None, rate: float) -> int:
    bootstrap, redis_url = os.environ["SGW_KAFKA_BOOTSTRAP"], os.environ["SGW_REDIS_URL"]
    catalog, receiver = local_channels(yaml.safe_load(CATALOG.read_text()))
    receiver.start()
    print(f"webhook receiver listening on {receiver.url}", flush=True)
    redis = Redis.from_url(redis_url)
    report = await MonitorClient(redis).apply(catalog)
    await redis.aclose()
    print(f"catalog applied: {len(report.created)} created, {len(report.changed)} changed", flush=True)

    await ensure_topics(Settings())  # before anything reads them, so nobody waits on metadata
    judge = JudgeServer(default_rating=7).start()
    metrics_port = free_port()
    env = {**os.environ, "SGW_JUDGE_BASE_URL": judge.base_url, "SGW_LOG_FORMAT": "console",
           "SGW_METRICS_PORT": str(metrics_port),
           "SGW_EGRESS_ALLOW": "127.0.0.1/32",  # the local receiver; every other private address stays refused
           "SGW_WEBHOOK_RETRY_SCHEDULE": "1s,2s"}  # a refused delivery dead-letters within seconds
    worker = await asyncio.create_subprocess_exec(sys.executable, "-m", "worker.cli", "run",
                                                  env=env, cwd=ROOT)
    print(f"worker started (metrics on http://127.0.0.1:{metrics_port}/metrics); Ctrl-C stops", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    topics = {"ratings": "scorer-groups.ratings", "signals": "scorer-groups.signals",
              "webhooks": "scorer-groups.webhooks", "dlq": "traces.dlq",
              "webhooks-dlq": "scorer-groups.webhooks.dlq"}
    tasks = [asyncio.create_task(_produce(bootstrap, "traces.ingested", rate, stop)),
             asyncio.create_task(_tail(bootstrap, topics, stop))]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    worker.send_signal(signal.SIGTERM)
    code = await worker.wait()
    judge.stop()
    receiver.stop()
    print(f"worker exited with {code}", flush=True)
    return code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long")
    parser.add_argument("--rate", type=float, default=4.0, help="sample traces per second")
    args = parser.parse_args()
    return asyncio.run(main_async(args.seconds, args.rate))


if __name__ == "__main__":
    sys.exit(main())
