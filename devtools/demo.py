"""The demo behind `./dev demo`, the product tour: the real worker on sample traffic, and the API beside it.

Needs SGW_KAFKA_BOOTSTRAP and SGW_REDIS_URL (``python -m devtools.services run -- ...`` sets them).
It applies the example catalog, starts the local judge, the worker and the API, produces traces with a
quality dip and a budget that runs out, and prints what comes out, until Ctrl-C (or ``--seconds``).
The steps: docs/design-notes.md.
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
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from redis.asyncio import Redis

from adapters.stores.apikeys import ApiKeyStore
from devtools.judge_server import JudgeServer
from devtools.processes import free_port
from devtools.webhook_receiver import WebhookReceiver
from scoring.filters import routing_headers
from scoring.models import Budget
from scoring.subjects import Trace
from services.groups import MonitorClient
from worker.app import ensure_topics
from worker.logs import configure_logging
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CATALOG = ROOT / "deploy" / "catalog.example.yaml"

# (project, agent, question, answer) - the judge server rates by the [[rating=N]] marker.
# The example channels' URLs are replaced by a local receiver's (devtools/webhook_receiver.py):
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


PROJECT = "shop-support"  # the demo key's project: its groups are the console's
CYCLE_S = 90  # the traffic's shape repeats: a dip, a recovery, a moment without budget
DIP_S = (20, 40)  # seconds into a cycle when the support bot's answers are poor
NO_BUDGET_S = (55, 70)  # seconds into a cycle when the project's budget has no room
DIP_ANSWER = "I don't know, please ask someone else. [[rating=2]]"


# How often each sample comes: mostly good answers, now and then a leak or a poor one.
WEIGHTS = [6, 3, 0.5, 0.5, 1, 2, 1]


def _trace(n: int, rng: random.Random, dip: bool = False) -> dict[str, Any]:
    project, agent, question, answer = rng.choices(SAMPLES, WEIGHTS)[0]
    if dip and agent == "support-bot":
        answer = DIP_ANSWER
    if n % 4:  # most answers name their ticket; one in four is a template sent as it is (the cache's)
        answer += f" (ticket {n})"
    return {"traceId": f"demo-{n}", "projectId": project, "agentId": agent,
            "sessionId": f"demo-session-{n // 3}", "timestamp": datetime.now(UTC).isoformat(),
            "spans": [{"spanId": "root", "name": "agent.run", "input": question, "output": answer}]}


def _in(window: tuple[int, int], elapsed: float) -> bool:
    return window[0] <= elapsed % CYCLE_S < window[1]


async def _produce(bootstrap: str, topic: str, rate: float, stop: asyncio.Event) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    rng = random.Random(7)
    started, dipping = time.monotonic(), False
    try:
        for n in itertools.count():
            if stop.is_set():
                break
            if dipping != _in(DIP_S, time.monotonic() - started):
                dipping = not dipping
                print(f"TRAFFIC the support bot's answers get poor: a quality dip (from demo-{n})" if dipping
                      else f"TRAFFIC the support bot's answers are good again: it recovers (from demo-{n})",
                      flush=True)
            trace = _trace(n, rng, dip=dipping)
            # With the routing headers the worker reads before parsing (scoring.filters).
            await producer.send(topic, key=trace["traceId"].encode(), value=orjson.dumps(trace),
                                headers=routing_headers(Trace.model_validate(trace)))
            if n == 3:  # one malformed record, to show the dead-letter topic at work
                await producer.send(topic, key=b"broken", value=b"{this is not json")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1 / rate)
    finally:
        await producer.stop()


async def _tail(bootstrap: str, topics: dict[str, str], stop: asyncio.Event, first_rating: Callable[[], None]) -> None:
    consumer = AIOKafkaConsumer(*topics.values(), bootstrap_servers=bootstrap,
                                auto_offset_reset="earliest", group_id=None)
    await consumer.start()
    kinds = {v: k for k, v in topics.items()}
    rated = False
    try:
        while not stop.is_set():
            for tp, records in (await consumer.getmany(timeout_ms=300)).items():
                for record in records:
                    print(_line(kinds[tp.topic], orjson.loads(record.value)), flush=True)
                    if not rated and kinds[tp.topic] == "ratings":
                        rated = True
                        first_rating()
    finally:
        await consumer.stop()


async def _budget_moments(redis_url: str, stop: asyncio.Event) -> None:
    """Every cycle, as the operators would: the demo project's budget lowered to what its window
    has used (its groups are then skipped, "skipped for budget" in the console), then given back."""
    redis = Redis.from_url(redis_url)
    scorers = MonitorClient(redis).scorers
    started = time.monotonic()
    try:
        while not stop.is_set():
            elapsed = (time.monotonic() - started) % CYCLE_S
            start, end = NO_BUDGET_S
            wait = (start - elapsed) % CYCLE_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)
                return
            budget = await scorers.budget_use(PROJECT)
            full = budget.judge_calls_per_window
            await scorers.put(Budget(project_id=PROJECT, judge_calls_per_window=budget.used.judge_calls,
                                     window_seconds=budget.window_seconds))
            print(f"BUDGET  {PROJECT}: no room left ({budget.used.judge_calls} judge calls used) - its groups are "
                  f"skipped for {end - start} s", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=end - start)
            await scorers.put(Budget(project_id=PROJECT, judge_calls_per_window=full,
                                     window_seconds=budget.window_seconds))
            print(f"BUDGET  {PROJECT}: back to {full} judge calls an hour - scored again", flush=True)
    finally:
        await redis.aclose()


def tour(api_url: str, key: str, metrics_url: str) -> str:
    """Where to look, printed once the first ratings are in. The SDK lines run as printed."""
    rule = "-" * 100
    return "\n".join([
        rule,
        "The first ratings are in. Look around:",
        f"  console     {api_url}/console  - paste the key, open 'Support quality bar', window 1h",
        f"  key         {key}  (project {PROJECT})",
        f"  API docs    {api_url}/docs",
        f"  metrics     {metrics_url}; the dashboard to import into Grafana: deploy/grafana/scorer-group-worker.json",
        "  the SDK     paste the lines between the rules as they are (a shell heredoc):",
        "-" * 40,
        ".venv/bin/python - <<'EOF'",
        *sdk_snippet(api_url, key).splitlines(),
        "EOF",
        "-" * 40,
        f"  the traffic every {CYCLE_S} s: a quality dip at {DIP_S[0]}-{DIP_S[1]} s (Signals, verified deliveries), "
        f"no budget at {NO_BUDGET_S[0]}-{NO_BUDGET_S[1]} s",
        rule,
    ])


def sdk_snippet(api_url: str, key: str) -> str:
    return "\n".join([
        "from scorer_groups import Client",
        f'client = Client("{api_url}", "{key}")',
        "for group in client.monitor.scorer_groups.list():",
        '    r = client.monitor.scorer_groups.ratings(group.id, window="1h")',
        '    print(f"{group.name}: {r.scored} scored, mean {r.mean}, {r.below_threshold} below the bar, "',
        '          f"{r.skipped} skipped for budget")',
    ])


def _line(kind: str, v: dict[str, Any]) -> str:
    subject = v.get("traceId") or f"session {v.get('sessionId')}"  # a session-scope verdict has no trace
    rating = "  -  " if v.get("rating") is None else f"{v['rating']:5.2f}"
    if kind == "ratings":
        return f"RATING  {rating}  {v['groupId']:<22} {subject:<10} {v['justification'][:110]}"
    if kind == "signals":
        why = "no score" if v.get("rating") is None else f"rating {rating.strip()} < {v['alertThreshold']}"
        return f"SIGNAL  {v['severity']:<8} {v['key']} {why} ({subject})"
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
    configure_logging("console")  # aiokafka's chatter while the cluster settles stays out of sight
    bootstrap, redis_url = os.environ["SGW_KAFKA_BOOTSTRAP"], os.environ["SGW_REDIS_URL"]
    settings = Settings()
    # 1. the catalog, the key
    catalog, receiver = local_channels(yaml.safe_load(CATALOG.read_text()))
    receiver.start()
    print(f"webhook receiver listening on {receiver.url}", flush=True)
    redis = Redis.from_url(redis_url)
    report = await MonitorClient(redis).apply(catalog)
    _, key = await ApiKeyStore(redis).create(PROJECT, "demo")
    await redis.aclose()
    print(f"catalog applied: {len(report.created)} created, {len(report.changed)} changed", flush=True)

    # 2. the topics, settled: before anything reads or joins them
    await ensure_topics(settings)
    # 3. the judge, the worker, the API
    judge = JudgeServer(default_rating=7).start()
    metrics_port, api_port = free_port(), free_port()
    env = {**os.environ, "SGW_JUDGE_BASE_URL": judge.base_url, "SGW_LOG_FORMAT": "console",
           "SGW_METRICS_PORT": str(metrics_port), "SGW_API_PORT": str(api_port), "SGW_API_HOST": "127.0.0.1",
           "SGW_EGRESS_ALLOW": "127.0.0.1/32",  # the local receiver; every other private address stays refused
           "SGW_WEBHOOK_RETRY_SCHEDULE": "1s,2s"}  # a refused delivery dead-letters within seconds
    worker = await asyncio.create_subprocess_exec(sys.executable, "-m", "worker.cli", "run", env=env, cwd=ROOT)
    api = await asyncio.create_subprocess_exec(sys.executable, "-m", "worker.cli", "api", env=env, cwd=ROOT)
    api_url, metrics_url = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{metrics_port}/metrics"
    print("worker and API started; the tour is printed once the first ratings are in. Ctrl-C stops", flush=True)

    # 4. and 5. traffic, and what comes of it
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    topics = {"ratings": settings.ratings_topic, "signals": settings.signals_topic,
              "webhooks": settings.webhooks_topic, "dlq": settings.dlq_topic,
              "webhooks-dlq": settings.webhooks_dlq_topic}
    tasks = [asyncio.create_task(_produce(bootstrap, settings.traces_topic, rate, stop)),
             asyncio.create_task(_tail(bootstrap, topics, stop,
                                       lambda: print(tour(api_url, key, metrics_url), flush=True))),
             asyncio.create_task(_budget_moments(redis_url, stop))]
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    for process in (worker, api):
        process.send_signal(signal.SIGTERM)
    code = await worker.wait()
    await api.wait()
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
