"""What a trace's pure steps cost in-process, per step: no broker, no Redis, no sandbox process.

    .venv/bin/python -m tests.bench.bench_pure [--traces 30000] [--rounds 3]

The deterministic scenario's two groups (tests/bench/workload.py) on the benchmark's traces, in
batches of 128 as the worker takes them, with the worker's metrics and collector thresholds:
decode (orjson and the Trace model), route (subject, sample, claims), score (patterns inline, the
code scorer through an in-process stand-in for the sandbox, the blend), encode (ratings) and
Signals and history. The drains (tests.bench.suite) measure the whole worker, but their noise on
this machine is larger than most single changes to these steps; this is where those are measured.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from typing import Any

from consumers.decode import decode_trace
from scoring.catalog import CatalogSnapshot
from scoring.models import CustomEvaluator, Pattern, ScorerGroup
from scoring.panel import Panel
from scoring.results import build_signal, encode_rating, history_entry
from scoring.routing import trace_pairs
from tests.bench.workload import DETERMINISTIC_CATALOG, trace_value
from worker.app import GC_THRESHOLDS
from worker.metrics import PrometheusEvents, observe_member

BATCH = 128
STEPS = ("decode", "route", "score", "encode", "signals+history")


class InProcessSandbox:
    """The workload's code scorer (a length check), without a process: the sandbox's own cost is
    tests/bench/bench_sandbox.py's."""

    async def run_many(self, project: str, key: str, code: str, calls: list[dict[str, Any]],
                       timeout_s: float) -> list[float]:
        return [min(1.0, len(args["output"]) / 600) for args in calls]


def snapshot() -> CatalogSnapshot:
    c = DETERMINISTIC_CATALOG
    return CatalogSnapshot(
        version=1, patterns={p["id"]: Pattern.model_validate(p) for p in c["patterns"]},
        customs={x["id"]: CustomEvaluator.model_validate(x) for x in c["customs"]},
        groups={f"{g['projectId']}/{g['id']}": ScorerGroup.model_validate(g) for g in c["groups"]})


async def one_round(values: list[bytes], catalog: CatalogSnapshot, panel: Panel) -> dict[str, float]:
    events = PrometheusEvents()
    spent = dict.fromkeys(STEPS, 0.0)
    clock = time.process_time  # CPU, not wall: a busy neighbour of this VM steals the latter
    for start in range(0, len(values), BATCH):
        t0 = clock()
        traces = [decode_trace("traces", 0, start + i, None, v, 1 << 20) for i, v in enumerate(values[start:start + BATCH])]
        t1 = clock()
        pairs = [pair for trace in traces for pair in trace_pairs(trace, catalog)]  # type: ignore[arg-type]
        t2 = clock()
        results = await panel.score_many([(pair.group, pair.subject) for pair in pairs], catalog)
        t3 = clock()
        ratings = [encode_rating(result, "trace") for result in results]
        t4 = clock()
        for result, rating in zip(results, ratings, strict=True):
            events.group_scored(result.group.project_id, result.group.id, "trace", rating.rating)
            signal = build_signal(result.group, rating)
            if signal is not None:
                signal.to_json()
            history_entry(result.group, rating, rating.document)
        t5 = clock()
        for step, seconds in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            spent[step] += seconds
    return {step: seconds / len(values) * 1e6 for step, seconds in spent.items()}


async def main(args: argparse.Namespace) -> None:
    values = [trace_value(n) for n in range(args.traces)]
    catalog, panel = snapshot(), Panel(sandbox=InProcessSandbox(), observe=observe_member)  # type: ignore[arg-type]
    gc.freeze()  # as the worker does once started
    gc.set_threshold(*GC_THRESHOLDS)
    await one_round(values[:2000], catalog, panel)  # warm: compiled patterns, metric children
    for _ in range(args.rounds):
        us = await one_round(values, catalog, panel)
        print("  ".join(f"{step} {us[step]:5.1f}" for step in STEPS), f"| total {sum(us.values()):6.1f} us a trace")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
