"""The backfill runner on the real broker and Redis, with a local judge: a day of past
traces, a group, a job over that day.

- every trace rated once with origin "backfill", in the history at the trace's time, paging
  nobody; the same window again rates nothing new; another project's trace is never graded;
- a changed rubric (a new revision of the group) grades the window again;
- a budget of N judge calls a window: the job pauses at N and resumes in the next window;
- ``maxJudgeCalls``: the job ends where the cap stopped it;
- ``alerts: true``: a backfill's results below the threshold raise Signals;
- span scope: each matching step once;
- live traffic first: a pressed live loop holds the backfill back;
- a window that ends after a transaction marker is read to its end.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from adapters.members.judge import JudgeClient
from adapters.stores.backfills import BackfillStore
from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from consumers.decode import DeadLetter, decode_trace
from scorer_groups.api_models import BackfillCreate
from scoring.catalog import CatalogSnapshot
from scoring.models import Budget, Judge, JudgeExample, Pattern
from scoring.panel import Panel
from scoring.prices import Price, Pricing
from scoring.routing import group_pairs
from tests.support import backfill_bench
from tests.support.backfill_bench import APOLOGY, BY_JUDGE, BY_PATTERN, DAY, SORRY, Bench, group_doc, trace
from tests.support.harness import read_topic

pytestmark = pytest.mark.integration

bench, judge_server = backfill_bench.bench, backfill_bench.judge_server  # the fixtures, for this module


async def test_a_job_rates_a_past_days_traces_once_each_as_backfill(bench: Bench) -> None:
    traces = [trace(bench.project, n, SORRY if n % 2 else "done") for n in range(20)]
    # A hostile tenant's trace in the same window, naming another project: never this job's.
    intruder = {**trace(bench.project, 1, "done"), "traceId": "intruder", "projectId": f"other-{bench.unique}"}
    await bench.produce([*traces, intruder])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_PATTERN)
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY})

    first = await bench.run(bench.runner(lambda: snapshot), await bench.job(group))
    ratings = await bench.ratings(len(traces))
    second = await bench.run(bench.runner(lambda: snapshot), await bench.job(group))
    again = await bench.ratings(len(traces), settle_s=2)

    assert sorted(r["traceId"] for r in ratings) == sorted(t["traceId"] for t in traces), \
        "every trace of the project once; another project's trace in the window is not graded"
    assert {r["origin"] for r in ratings} == {"backfill"}
    assert len(again) == len(traces), "the same window again rates nothing new"
    assert first.status == second.status == "done"
    assert (first.progress.fraction, first.progress.traces_read, first.progress.pairs_scored) == (1.0, 20, 20), \
        "the intruder's trace is not counted either"
    assert (second.progress.pairs_scored, second.progress.pairs_skipped) == (0, 20), "already rated: skipped"
    history = await RatingsStore(bench.redis).history(group.id, "30d")
    assert history.count == 20 and history.below == 10, "counted, at the traces' own days"
    assert all(DAY.timestamp() <= b.start < (DAY + timedelta(days=1)).timestamp() for b in history.buckets if b.count)
    signals = await read_topic(bench.bootstrap, bench.names.signals, until=lambda v: True, timeout_s=3)
    assert signals == [], "last week's traffic pages nobody"


async def test_a_changed_rubric_grades_the_window_again(bench: Bench) -> None:
    await bench.produce([trace(bench.project, n, SORRY) for n in range(6)])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_PATTERN)
    before = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY})
    await bench.run(bench.runner(lambda: before), await bench.job(group))
    await bench.ratings(6)

    # The pattern's rule changes: the group's ratings mean something else now.
    changed = CatalogSnapshot(groups={group.id: group}, patterns={"apology": Pattern(
        id="apology", name="Apology", polarity="failure", contains=["nothing like this"])})
    assert changed.revision(group) != before.revision(group)
    assert CatalogSnapshot(groups={group.id: group.model_copy(update={"name": "Renamed"})},
                           patterns={"apology": APOLOGY}).revision(group) == before.revision(group), \
        "a name is not how it grades"
    regraded = await bench.run(bench.runner(lambda: changed), await bench.job(group))
    ratings = await bench.ratings(12)
    once_more = await bench.run(bench.runner(lambda: changed), await bench.job(group))

    assert regraded.progress.pairs_scored == 6, "rated under another revision: graded again"
    assert [r["rating"] for r in ratings[6:]] == [10.0] * 6 and [r["rating"] for r in ratings[:6]] == [0.0] * 6
    assert (once_more.progress.pairs_scored, once_more.progress.pairs_skipped) == (0, 6)


async def test_a_judge_promoted_with_examples_grades_the_window_again_as_its_examples_say(bench: Bench) -> None:
    """Examples are part of the rubric - a judge promoted with them is a new revision,
    and its verdicts follow them (the local judge grades a case as the example sharing its marker)."""
    await bench.produce([trace(bench.project, n, f"answer {n} [[case=refund]]") for n in range(4)])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_JUDGE)
    plain = Judge(id="j", name="J", criteria="Helpful?")
    before = CatalogSnapshot(groups={group.id: group}, judges={"j": plain})
    await bench.run(bench.runner(lambda: before), await bench.job(group))
    taught = plain.model_copy(update={"examples": [JudgeExample(id="e", input="q", output="x [[case=refund]]",
                                                                rating=2)]})
    promoted = CatalogSnapshot(groups={group.id: group}, judges={"j": taught})
    assert promoted.revision(group) != before.revision(group)
    regraded = await bench.run(bench.runner(lambda: promoted), await bench.job(group))
    ratings = await bench.ratings(8)
    assert regraded.progress.pairs_scored == 4, "a new revision: the window graded again"
    assert [r["rating"] for r in ratings[:4]] == [7.0] * 4, "before: the local judge's default"
    assert [r["rating"] for r in ratings[4:]] == [2.0] * 4, "after: as the example says"


async def test_a_budget_of_n_calls_pauses_the_job_at_n_and_it_resumes_in_the_next_window(bench: Bench) -> None:
    window_s, per_window, traces = 6, 5, 10
    backfills_share = 4  # a backfill leaves live traffic a fifth of every window (consumers.backfill.LIVE_SHARE)
    await bench.produce([trace(bench.project, n, "fine") for n in range(traces)])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_JUDGE)
    snapshot = CatalogSnapshot(groups={group.id: group}, judges={"j": Judge(id="j", name="J", criteria="Helpful?")},
                               budgets={bench.project: Budget(project_id=bench.project, window_seconds=window_s,
                                                              judge_calls_per_window=per_window)})
    job_id = await bench.job(group)
    await asyncio.sleep(window_s - time.time() % window_s + 0.2)  # a whole window ahead: the pause comes at N
    paused = await bench.run(bench.runner(lambda: snapshot), job_id, until=lambda j: j.status == "paused")
    assert paused.progress.judge_calls == backfills_share and paused.progress.pairs_scored == backfills_share
    assert len(bench.judge.requests) == backfills_share, "not one call past the budget (less live's share)"
    assert paused.resume_at is not None and paused.resume_at.timestamp() % window_s == 0
    assert paused.resume_at > datetime.now(UTC), "resumes when the next window opens"

    done = await bench.run(bench.runner(lambda: snapshot), job_id, timeout_s=4 * window_s)
    ratings = await bench.ratings(traces)
    assert done.status == "done" and done.progress.fraction == 1.0
    assert sorted(r["traceId"] for r in ratings) == sorted(f"t-{n}" for n in range(traces)), "each once"
    assert done.progress.judge_calls == traces == len(bench.judge.requests)
    assert done.progress.pairs_skipped == 0, "a pair the budget refused was graded later, not skipped"


async def test_a_money_budget_pauses_the_job_at_its_cost_leaving_live_its_share(bench: Bench) -> None:
    pricing = Pricing({"gpt-4o-mini": Price(input=2.0, output=10.0)}, "gpt-4o-mini")  # the client's default model
    traces = [trace(bench.project, n, "fine") for n in range(10)]
    await bench.produce(traces)
    group = group_doc(f"g-{bench.unique}", bench.project, BY_JUDGE)
    judges = {"j": Judge(id="j", name="J", criteria="Helpful?")}
    decoded = decode_trace("t", 0, 0, None, orjson.dumps(traces[0]), 1 << 20)
    assert not isinstance(decoded, DeadLetter)
    probe = CatalogSnapshot(groups={group.id: group}, judges=judges, budgets={bench.project: Budget(
        project_id=bench.project, judge_calls_per_window=1000, judge_cost_per_window=1.0)})
    (pair,) = group_pairs(decoded, group, probe, sample_rate=1.0, pricing=pricing)
    per_pair = pair.claim.cost(pair.claim.judge_calls, pair.claim.judge_tokens)  # every trace's: the same text
    # Room for 2.5 pairs' cost ceilings in the backfill's share (live traffic keeps a fifth).
    cap = 2.5 * per_pair / 0.8 / 1e9
    snapshot = CatalogSnapshot(groups={group.id: group}, judges=judges, budgets={bench.project: Budget(
        project_id=bench.project, judge_calls_per_window=1000, judge_cost_per_window=cap)})
    client = JudgeClient(bench.judge.base_url, timeout_s=5, prices=pricing.prices)
    bench.panel = Panel(judges=client, member_deadline_s=10, pricing=pricing)
    try:
        paused = await bench.run(bench.runner(lambda: snapshot), await bench.job(group),
                                 until=lambda j: j.status == "paused")
    finally:
        await client.close()
    assert (paused.progress.pairs_scored, paused.progress.judge_calls) == (2, 2), "a third would pass its cap: whole"
    assert len(bench.judge.requests) == 2 and paused.resume_at is not None
    settled = await Claims(bench.redis).cost_used(bench.project, 3600)
    assert 0 < settled < 2 * per_pair, "settled to what the two calls cost, under their ceilings"


async def test_max_judge_calls_ends_the_job_where_it_stopped(bench: Bench) -> None:
    await bench.produce([trace(bench.project, n, "fine") for n in range(10)])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_JUDGE)
    snapshot = CatalogSnapshot(groups={group.id: group}, judges={"j": Judge(id="j", name="J", criteria="Helpful?")})
    done = await bench.run(bench.runner(lambda: snapshot), await bench.job(group, maxJudgeCalls=3))
    ratings = await bench.ratings(3, settle_s=2)
    assert done.status == "done" and len(ratings) == 3 and len(bench.judge.requests) == 3
    assert done.progress.judge_calls == 3 and done.progress.fraction < 1.0
    assert any("maxJudgeCalls (3)" in note for note in done.notes), done.notes


async def test_alerts_true_raises_the_signals_of_a_backfill(bench: Bench) -> None:
    await bench.produce([trace(bench.project, n, SORRY if n < 2 else "done") for n in range(5)])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_PATTERN)
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY})
    await bench.run(bench.runner(lambda: snapshot), await bench.job(group, alerts=True))
    signals = await read_topic(bench.bootstrap, bench.names.signals, until=lambda v: len(v) >= 2, settle_s=1)
    assert sorted(s["traceId"] for s in signals) == ["t-0", "t-1"]


async def test_a_span_scope_group_grades_each_matching_step_once(bench: Bench) -> None:
    steps = [{"spanId": "root", "name": "agent", "input": "q", "output": "done"},
             {"spanId": "s1", "parentSpanId": "root", "name": "tool", "input": "x", "output": SORRY},
             {"spanId": "s2", "parentSpanId": "root", "name": "tool", "input": "y", "output": "ok"}]
    await bench.produce([{**trace(bench.project, n, "done"), "spans": steps} for n in range(3)])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_PATTERN, scope="span",
                      spanFilter={"field": "name", "op": "eq", "value": "tool"})
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY})
    done = await bench.run(bench.runner(lambda: snapshot), await bench.job(group))
    ratings = await bench.ratings(6)
    assert done.progress.pairs_scored == 6
    assert sorted((r["traceId"], r["spanId"]) for r in ratings) == sorted(
        (f"t-{n}", s) for n in range(3) for s in ("s1", "s2"))
    assert {r["scope"] for r in ratings} == {"span"}


async def test_live_traffic_goes_first(bench: Bench) -> None:
    await bench.produce([trace(bench.project, n, "done") for n in range(4)])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_PATTERN)
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY})
    pressed = True
    job_id = await bench.job(group)
    jobs = BackfillStore(bench.redis)
    stop = asyncio.Event()
    running = asyncio.create_task(bench.runner(lambda: snapshot, live_pressed=lambda: pressed).run(stop))
    try:
        # Planned (its status running: a loaded machine may take more than a tick - a CI run
        # once took over 30 s to start the planning consumer), then held back for a second of
        # ticks more.
        deadline = time.monotonic() + 90
        while (await jobs.get(job_id)).status == "queued" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        held = await jobs.get(job_id)
        pressed = False
        deadline = time.monotonic() + 30
        while (await jobs.get(job_id)).status != "done" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await running
    assert held.status == "running" and held.progress.traces_read == 0, "nothing read while live traffic pressed"
    assert (await jobs.get(job_id)).progress.pairs_scored == 4


async def test_a_window_ending_on_a_transaction_marker_is_read_to_its_end(bench: Bench) -> None:
    # A transactional producer's commit marker takes an offset with no record behind it: the last
    # offset of a window that ends after it is never returned by a fetch; the job ends all the same.
    producer = AIOKafkaProducer(bootstrap_servers=bench.bootstrap, transactional_id=f"tx-{bench.unique}")
    await producer.start()
    began = datetime.now(UTC) - timedelta(minutes=1)
    try:
        async with producer.transaction():
            for n in range(3):
                t = {**trace(bench.project, n, "done"), "timestamp": datetime.now(UTC).isoformat()}
                await producer.send(bench.names.traces, orjson.dumps(t), key=t["traceId"].encode(), partition=0)
    finally:
        await producer.stop()
    await asyncio.sleep(1.0)  # the window ends after the marker
    group = group_doc(f"g-{bench.unique}", bench.project, BY_PATTERN)
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY})
    window = BackfillCreate.model_validate({"from": began.isoformat(), "to": datetime.now(UTC).isoformat()})
    job = await BackfillStore(bench.redis).create(group.id, group.project_id, window, 1.0)
    done = await bench.run(bench.runner(lambda: snapshot), job.id, timeout_s=30)
    assert done.status == "done" and done.progress.fraction == 1.0 and done.progress.pairs_scored == 3
