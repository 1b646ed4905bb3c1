"""The filtered scenario: what a trace no group wants costs, beside the plain Kafka stage (limit).

The deterministic groups, each with ``online.filter`` ``agentId eq support-agent``, drain three
topics of ``--traces`` ~2 KB traces each:

- unwanted_headers: every trace from an agent no filter takes, with the routing headers the
  OTLP intake and the demo write: decided before its value is parsed;
- unwanted_no_headers: the same traces without headers: each is decoded, validated and
  filtered out on the trace;
- mixed_headers: 90% unwanted, 10% wanted (with headers): the issue's traffic.

A topic that produces no output is measured by its commits: the worker's CPU (and its
children's) from the first commit that moved to the last offset, over the traces committed in
between. ``cpu_vs_limit`` is that CPU per trace over the limit stage's in the same run.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
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


async def _drain_by_commits(bench: Bench, name: str, topic: str, traces: int) -> dict[str, Any]:
    redis_url = await bench.fresh_db(filtered_catalog())
    worker = bench.worker(name, redis_url, topic=topic)
    group_id = worker.env["SGW_CONSUMER_GROUP"]
    assert worker.proc is not None
    tree = ProcessTree(worker.proc.pid).start()
    try:
        deadline = time.monotonic() + max(300.0, traces / 100)
        while (first := await _committed(bench.bootstrap, group_id)) == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        tree.mark()
        marked = time.monotonic()
        done = first
        while done < traces and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            done = await _committed(bench.bootstrap, group_id)
        cpu_s, wall_s = tree.cpu_s(), time.monotonic() - marked
    finally:
        tree.stop()
        worker.stop(timeout_s=120)
    measured = max(1, done - first)
    return {"traces": done, "complete": done >= traces, "measured_traces": measured, "seconds": round(wall_s, 2),
            "traces_per_s": round(measured / wall_s, 1), "cpu_s_per_1k": round(cpu_s / measured * 1000, 3),
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
    await produce_traces(bench.bootstrap, topic, 0, bench.traces, agent=variant.agent, headers=variant.headers)
    return await _drain_by_commits(bench, f"filtered-{variant.name}", topic, bench.traces)
