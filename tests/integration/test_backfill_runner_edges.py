"""The backfill runner where it is hard (found by a review, each failed before its fix):

- ``maxJudgeCalls`` holds for the calls decided while a pair is scored: a gates-first group's
  judges, and retries;
- a failed claim gives back the calls it had counted against the cap;
- a pair another worker held, refused by the budget once free, pauses the job (not lost);
- a job id without its document does not stall the other jobs;
- two workers on a job whose chunks outlast nothing: no judge call twice, no pause without a budget;
- a cancelled job stops within a chunk.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest

import consumers.backfill as backfill_module
from adapters.stores import keys
from adapters.stores.backfills import BackfillStore
from devtools.judge_server import Behaviour
from scorer_groups.api_models import BACKFILL_ENDED
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import day_of
from scoring.models import Budget, Judge
from tests.support import backfill_bench
from tests.support.backfill_bench import APOLOGY, BY_JUDGE, BY_PATTERN, DAY, Bench, group_doc, trace

pytestmark = pytest.mark.integration

bench, judge_server = backfill_bench.bench, backfill_bench.judge_server  # the fixtures, for this module


def judged(bench: Bench) -> CatalogSnapshot:
    group = group_doc(f"g-{bench.unique}", bench.project, BY_JUDGE)
    return CatalogSnapshot(groups={group.id: group}, judges={"j": Judge(id="j", name="J", criteria="Helpful?")})


def minutes_apart(bench: Bench, n: int) -> list[dict[str, Any]]:
    return [{**trace(bench.project, i, "fine"), "timestamp": (DAY + timedelta(minutes=i)).isoformat()}
            for i in range(n)]


async def test_max_judge_calls_caps_a_gates_first_groups_judges(bench: Bench) -> None:
    await bench.produce([trace(bench.project, n, "fine") for n in range(6)])
    members = [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": True}, *BY_JUDGE]
    group = group_doc(f"g-{bench.unique}", bench.project, members).model_copy(update={"gates_first": True})
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY},
                               judges={"j": Judge(id="j", name="J", criteria="Helpful?")})
    done = await bench.run(bench.runner(lambda: snapshot), await bench.job(group, maxJudgeCalls=2))
    assert len(bench.judge.requests) == 2 == done.progress.judge_calls, done
    assert done.status == "done" and any("maxJudgeCalls (2)" in note for note in done.notes), done


async def test_max_judge_calls_counts_retries(bench: Bench) -> None:
    await bench.produce([trace(bench.project, n, "fine") for n in range(3)])
    bench.judge.script(*[Behaviour.status(500) for _ in range(3)])
    snapshot = judged(bench)
    group = next(iter(snapshot.groups.values()))
    done = await bench.run(bench.runner(lambda: snapshot), await bench.job(group, maxJudgeCalls=3))
    assert len(bench.judge.requests) <= 3, f"{len(bench.judge.requests)} judge requests; {done}"
    assert done.progress.judge_calls <= 3


async def test_a_failed_claim_gives_back_the_calls_it_counted(bench: Bench) -> None:
    await bench.produce([trace(bench.project, n, "fine") for n in range(3)])
    snapshot = judged(bench)
    group = next(iter(snapshot.groups.values()))
    runner = bench.runner(lambda: snapshot)
    protocol = runner._protocols[False]
    real, failed = protocol.claim, []

    async def claim_once_broken(pairs: Any, snapshot: Any) -> Any:
        if not failed:
            failed.append(1)
            raise ConnectionError("redis blinked")
        return await real(pairs, snapshot)

    protocol.claim = claim_once_broken  # type: ignore[method-assign]
    done = await bench.run(runner, await bench.job(group, maxJudgeCalls=3))
    assert failed and done.status == "done"
    assert (done.progress.pairs_scored, done.progress.judge_calls) == (3, 3), done


async def test_a_pair_another_worker_held_refused_by_the_budget_once_free_pauses_the_job(bench: Bench) -> None:
    await bench.produce([trace(bench.project, 0, "fine")])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_JUDGE)
    window_s = 3600
    snapshot = CatalogSnapshot(groups={group.id: group}, judges={"j": Judge(id="j", name="J", criteria="Helpful?")},
                               budgets={bench.project: Budget(project_id=bench.project, window_seconds=window_s,
                                                              judge_calls_per_window=5)})
    await bench.redis.set(keys.judge_budget(bench.project, int(time.time()) // window_s * window_s), 5)  # spent
    secs, micros = await bench.redis.time()
    lease = f"lease:{secs * 1000 + micros // 1000 + 1500}:someone-else"  # frees up in 1.5 s
    await bench.redis.hset(keys.dedupe_claims(bench.project, day_of(DAY.timestamp())),
                           keys.dedupe_field(group.id, "trace:t-0"), lease)
    job = await bench.run(bench.runner(lambda: snapshot), await bench.job(group),
                          until=lambda j: j.status in (*BACKFILL_ENDED, "paused"), timeout_s=20)
    assert job.status == "paused" and job.progress.fraction == 0.0, job


async def test_a_job_id_without_its_document_does_not_stall_the_others(bench: Bench) -> None:
    await bench.produce([trace(bench.project, n, "done") for n in range(3)])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_PATTERN)
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY})
    await bench.redis.sadd(keys.BACKFILLS_ACTIVE, "bf-0000000000000000")  # sorts first, no document
    try:
        job = await bench.run(bench.runner(lambda: snapshot), await bench.job(group), timeout_s=15)
        assert job.status == "done"
        assert not await bench.redis.sismember(keys.BACKFILLS_ACTIVE, "bf-0000000000000000"), "forgotten"
    finally:
        await bench.redis.srem(keys.BACKFILLS_ACTIVE, "bf-0000000000000000")


async def test_two_workers_on_slow_chunks_judge_nothing_twice_and_never_pause_without_a_budget(
        bench: Bench, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill_module, "BATCH", 70)
    n = 140
    await bench.produce(minutes_apart(bench, n))
    bench.judge.set_default(Behaviour.deterministic(delay=2.0))  # a chunk takes 2 s; the leases last 5 s
    snapshot = judged(bench)
    group = next(iter(snapshot.groups.values()))
    job_id = await bench.job(group)
    stop = asyncio.Event()
    first = asyncio.create_task(bench.runner(lambda: snapshot, worker="w-a").run(stop))
    await asyncio.sleep(1.0)
    second = asyncio.create_task(bench.runner(lambda: snapshot, worker="w-b").run(stop))
    jobs = BackfillStore(bench.redis)
    try:
        deadline = time.monotonic() + 90
        while (job := await jobs.get(job_id)).status not in (*BACKFILL_ENDED, "paused") and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await asyncio.gather(first, second)
    assert job.status == "done", job
    assert len(bench.judge.requests) == n == job.progress.pairs_scored, (len(bench.judge.requests), job.progress)


async def test_a_cancelled_job_stops_within_a_chunk(bench: Bench) -> None:
    await bench.produce(minutes_apart(bench, 150))
    bench.judge.set_default(Behaviour.deterministic(delay=1.0))
    snapshot = judged(bench)
    group = next(iter(snapshot.groups.values()))
    job_id = await bench.job(group)
    stop = asyncio.Event()
    running = asyncio.create_task(bench.runner(lambda: snapshot).run(stop))
    try:
        while not bench.judge.requests:
            await asyncio.sleep(0.05)
        await BackfillStore(bench.redis).cancel(job_id)
        at_cancel = len(bench.judge.requests)
        await asyncio.sleep(5)
        after = len(bench.judge.requests) - at_cancel
    finally:
        stop.set()
        await running
    assert after <= backfill_module.CONCURRENCY, f"{after} judge calls after the cancel (a chunk at most)"
