"""The filtered scenario: what a trace no group wants costs, beside the plain Kafka stage (limit).

The deterministic groups, each with ``online.filter`` ``agentId eq support-agent``, drain three
topics of ``--traces`` ~2 KB traces each:

- unwanted_headers: every trace from an agent no filter takes, with the routing headers the
  OTLP intake and the demo write: decided before its value is parsed;
- unwanted_no_headers: the same traces without headers: each is decoded, validated and
  filtered out on the trace;
- mixed_headers: 90% unwanted, 10% wanted (with headers): the issue's traffic.

A topic that produces no output is measured by its commits: the worker starts on the empty
topic, its CPU (and its children's) is counted from when it is ready, the traces are produced
at once, and the count stops when its commits reach the last offset. ``cpu_vs_limit`` is that
CPU per trace over the limit stage's in the same run (which is measured in steady state: the
worker's figure includes its idle ticks and the ramp, so it errs against the worker).
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from tests.bench.scenarios import Bench
from tests.bench.workload import DETERMINISTIC_CATALOG, ProcessTree, create_topics, produce_traces

WANTED_AGENT = "support-agent"
WANTED_EVERY = 10  # the mixed topic: one trace in ten is wanted


def filtered_catalog() -> dict[str, Any]:
    catalog = copy.deepcopy(DETERMINISTIC_CATALOG)
    for group in catalog["groups"]:
        group["online"]["filter"] = {"field": "agentId", "op": "eq", "value": WANTED_AGENT}
    return catalog


async def _committed(bootstrap: str, group_id: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group_id)
        return sum(max(0, meta.offset) for meta in offsets.values())
    finally:
        await admin.close()


async def _drain_by_commits(bench: Bench, name: str, topic: str, traces: int,
                            produce: Callable[[], Awaitable[float]]) -> dict[str, Any]:
    """Start the worker on the empty topic, mark its CPU once it is ready, produce, and wait until
    its commits reach the end: a topic of unwanted traces yields no output to time, and drains
    within one commit interval - too fast to measure from the first commit on."""
    redis_url = await bench.fresh_db(filtered_catalog())
    worker = bench.worker(name, redis_url, topic=topic)
    group_id = worker.env["SGW_CONSUMER_GROUP"]
    assert worker.proc is not None
    try:
        worker.wait_ready()
        tree = ProcessTree(worker.proc.pid).start()
        try:
            tree.mark()
            marked = time.monotonic()
            await produce()
            deadline = time.monotonic() + max(300.0, traces / 100)
            done = 0
            while done < traces and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                done = await _committed(bench.bootstrap, group_id)
            cpu_s, wall_s = tree.cpu_s(), time.monotonic() - marked
        finally:
            tree.stop()
    finally:
        worker.stop(timeout_s=120)
    return {"traces": done, "complete": done >= traces, "seconds": round(wall_s, 2),
            "traces_per_s": round(done / wall_s, 1), "cpu_s_per_1k": round(cpu_s / max(1, done) * 1000, 3),
            "cpu_cores_used": round(cpu_s / wall_s, 2)}


@dataclass(frozen=True)
class Variant:
    name: str
    agent: Callable[[int], str]
    headers: bool


VARIANTS = (
    Variant("unwanted_headers", lambda n: "internal-bot", True),
    Variant("unwanted_no_headers", lambda n: "internal-bot", False),
    Variant("mixed_headers", lambda n: WANTED_AGENT if n % WANTED_EVERY == 0 else "internal-bot", True),
)


async def filtered(bench: Bench, variant: Variant) -> dict[str, Any]:
    topic = bench.name(f"filtered-{variant.name}")
    await create_topics(bench.bootstrap, [topic])
    return await _drain_by_commits(bench, f"filtered-{variant.name}", topic, bench.traces, lambda: produce_traces(
        bench.bootstrap, topic, 0, bench.traces, agent=variant.agent, headers=variant.headers))
