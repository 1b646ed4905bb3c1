"""What one code-scorer call costs through the real sandbox pool: CPU (the worker and every
sandbox process, from /proc) and wall time per call, for calls one at a time and for batches
(many subjects of one scorer in one message, as the worker's batch path sends them).

    .venv/bin/python -m tests.bench.bench_sandbox [--calls 2000] [--batch 64]

The scorer is the benchmark workload's code scorer (a length check). No broker, no Redis.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from adapters.members.sandbox import SandboxPool
from tests.bench.workload import DETERMINISTIC_CATALOG, ProcessTree

CODE: str = DETERMINISTIC_CATALOG["customs"][0]["code"]


def subject(i: int) -> dict[str, Any]:
    return {"input": "question", "output": "answer " * (i % 50), "expected": None, "spans": [], "metadata": {}}


async def measure(pool: SandboxPool, tree: ProcessTree, calls: int, batch: int) -> dict[str, float]:
    tree.mark()
    started = time.perf_counter()
    if batch == 1:
        for i in range(calls):
            await pool.run("bench", "length", CODE, subject(i), 2.0)
    else:
        for start in range(0, calls, batch):
            await pool.run_many("bench", "length", CODE, [subject(i) for i in range(start, start + batch)], 2.0)
    wall = time.perf_counter() - started
    cpu = tree.cpu_s()
    return {"calls": calls, "batch": batch, "wall_us_per_call": wall / calls * 1e6,
            "cpu_us_per_call": cpu / calls * 1e6}


async def main(args: argparse.Namespace) -> None:
    pool = SandboxPool(2, per_project=2)
    await pool.start()
    assert pool.available, pool.unavailable_reason
    tree = ProcessTree(os.getpid(), interval_s=0.05).start()
    try:
        await measure(pool, tree, 50, 1)  # warm: both processes started, the code compiled
        for batch in (1, args.batch):
            row = await measure(pool, tree, args.calls, batch)
            print(f"batch {row['batch']:>4}: {row['calls']} calls, {row['cpu_us_per_call']:8.1f} us CPU "
                  f"and {row['wall_us_per_call']:8.1f} us wall per call")
    finally:
        tree.stop()
        await pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--batch", type=int, default=64)
    asyncio.run(main(parser.parse_args()))
