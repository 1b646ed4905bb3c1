"""A backfill's estimate before it spends, on the real broker and Redis with a local
judge: a dry run reads a bounded share of the window, spends no judge call and claims nothing,
and what it says - pairs within its stated error, judge calls, tokens and cost - is what the real
job that follows grades and spends (exactly, when it read the whole window)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from aiokafka import AIOKafkaConsumer

from adapters.members.judge import JudgeClient
from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from consumers.backfill_estimate import estimate
from scorer_groups import AsyncClient
from scoring.catalog import CatalogSnapshot
from scoring.models import Judge
from scoring.panel import Panel
from scoring.prices import Price, Pricing
from tests.support import backfill_bench
from tests.support.api_process import ApiProcess, cli, create_key
from tests.support.backfill_bench import BY_JUDGE, DAY, Bench, group_doc

pytestmark = pytest.mark.integration

bench, judge_server = backfill_bench.bench, backfill_bench.judge_server  # the fixtures, for this module

MODEL = "gpt-4o-mini"  # the judge client's default
PRICING = Pricing({MODEL: Price(input=2.0, output=10.0)}, MODEL)


def traces(project: str, n: int, prefix: str = "t") -> list[dict[str, object]]:
    return [{"traceId": f"{prefix}-{i}", "projectId": project, "agentId": "a",
             "timestamp": (DAY + timedelta(minutes=2 * i)).isoformat(),
             "spans": [{"spanId": "r", "input": "q", "output": f"answer {i} [[rating=7]]"}]} for i in range(n)]


async def test_a_dry_run_spends_nothing_and_the_job_that_follows_is_within_its_error(bench: Bench) -> None:
    await bench.produce(traces(bench.project, 300) + traces(f"other-{bench.unique}", 150, "o"))
    group = group_doc(f"g-{bench.unique}", bench.project, BY_JUDGE, sampleRate=0.5)
    snapshot = CatalogSnapshot(groups={group.id: group}, judges={"j": Judge(id="j", name="J", criteria="Good?")})
    store = RatingsStore(bench.redis)

    async def dry_run(limit: int) -> object:
        return await estimate(
            lambda: AIOKafkaConsumer(bootstrap_servers=bench.bootstrap, group_id=None), bench.names.traces, group,
            snapshot, from_ms=int(DAY.timestamp() * 1000), to_ms=int((DAY + timedelta(days=1)).timestamp() * 1000),
            sample_rate=0.5, history=await store.history(group.id, "30d"),
            own_records=await store.traffic(bench.project, int(DAY.timestamp() * 1000),
                                            int((DAY + timedelta(days=1)).timestamp() * 1000)),
            pricing=PRICING, currency="EUR", limit=limit, max_trace_bytes=1 << 20, max_spans=50)

    before = await bench.redis.keys(f"*{{{bench.project}}}*")  # its traffic index, counted as it was sent
    sampled, whole = await dry_run(60), await dry_run(10_000)
    assert bench.judge.requests == [], "a dry run calls no judge"
    assert await Claims(bench.redis).budget_used(bench.project, 3600) == 0
    assert await bench.redis.keys(f"*{{{bench.project}}}*") == before, "no claim, budget or money key of the project"
    assert (whole.exact, whole.pairs_error, whole.basis) == (True, 0, "ceilings"), "read whole: exact"
    assert whole.traces == 300 and 100 < whole.pairs < 200 and whole.judge_calls == whole.pairs
    assert not sampled.exact and sampled.pairs_error > 0, "a bounded read says its error"
    assert whole.cost is not None and whole.cost > 0 and whole.currency == "EUR"

    judges = JudgeClient(bench.judge.base_url, timeout_s=5, prices=PRICING.prices)
    bench.panel = Panel(judges=judges, member_deadline_s=10, pricing=PRICING)
    try:
        job = await bench.run(bench.runner(lambda: snapshot), await bench.job(group, rate=0.5))
    finally:
        await judges.close()
    graded = job.progress.pairs_scored
    assert job.status == "done" and graded == whole.pairs, "read whole, the estimate is the job"
    assert abs(sampled.pairs - graded) <= sampled.pairs_error, (sampled, graded)
    assert job.progress.judge_calls == whole.judge_calls == len(bench.judge.requests)
    spent = (await store.history(group.id, "30d")).spent()
    assert 0 < spent.cost / 1e9 < whole.cost, "the ceilings: the most it could cost"

    after = await dry_run(10_000)  # now from the group's own history: what its results cost
    assert after.basis == "history" and after.pairs == graded
    assert after.cost == pytest.approx(spent.cost / 1e9, rel=1e-6) and after.tokens == spent.tokens
    assert after.judge_calls == spent.judge_calls


async def test_the_api_and_the_cli_answer_a_dry_run_and_start_nothing(bench: Bench, redis_url: str,
                                                                     tmp_path: Path) -> None:
    await bench.produce(traces(bench.project, 40))
    key = create_key(redis_url, "--project", bench.project)
    kafka = {"SGW_KAFKA_BOOTSTRAP": bench.bootstrap, "SGW_TRACES_TOPIC": bench.names.traces,
             "SGW_JUDGE_PRICES": '{"gpt-4o-mini": {"input": 2, "output": 10}}'}
    api = ApiProcess(redis_url, tmp_path / "api.log", env=kafka).start()
    try:
        async with httpx.AsyncClient(base_url=api.url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            judge = (await http.post("/v1/judges", json={"name": "J", "criteria": "Good?"})).json()
            group = (await http.post("/v1/scorer-groups", json={
                "name": "Past", "members": [{"kind": "judge", "refId": judge["id"], "weight": 1}],
                "online": {"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}})).json()
            window = {"from": DAY.isoformat(), "to": (DAY + timedelta(days=1)).isoformat()}
            answer = await http.post(f"/v1/scorer-groups/{group['id']}/backfills", json={**window, "dryRun": True})
            assert answer.status_code == 200, answer.text
            said = answer.json()["estimate"]
            assert (said["traces"], said["pairs"], said["pairsError"], said["judgeCalls"]) == (40, 40, 0, 40)
            assert said["cost"] > 0 and said["currency"] == "USD" and said["basis"] == "ceilings"
            async with AsyncClient(api.url, key) as sdk:  # the SDK's way to ask
                by_sdk = await sdk.monitor.scorer_groups.estimate_backfill(
                    group["id"], since=window["from"], until=window["to"], max_judge_calls=10)
            assert (by_sdk.pairs, by_sdk.judge_calls, by_sdk.capped) == (40, 10, True), "stops at its cap"
            assert by_sdk.cost == pytest.approx(said["cost"] / 4)
            assert (await http.get(f"/v1/scorer-groups/{group['id']}/backfills")).json() == [], "nothing started"
    finally:
        api.stop()
    printed = cli(redis_url, "backfill", "--project", bench.project, "--group", group["id"], "--since",
                  window["from"], "--until", window["to"], "--estimate", env=kafka)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith("estimate: 40 traces, 40 pairs (+/- 0, 95%), 40 judge calls"), printed.stdout
    assert bench.judge.requests == [], "no judge called"


async def test_a_tenant_learns_nothing_of_other_projects_from_a_dry_run_nor_asks_for_theirs(
        bench: Bench, redis_url: str, tmp_path: Path) -> None:
    # Another project's traffic shares the topic: 75 of its traces beside this project's 25.
    await bench.produce(traces(bench.project, 25) + traces(f"other-{bench.unique}", 75, "o"))
    ours, theirs = create_key(redis_url, "--project", bench.project), create_key(redis_url, "--project", "p-x")
    api = ApiProcess(redis_url, tmp_path / "api.log", env={"SGW_KAFKA_BOOTSTRAP": bench.bootstrap,
                                                          "SGW_TRACES_TOPIC": bench.names.traces}).start()
    window = {"from": DAY.isoformat(), "to": (DAY + timedelta(days=1)).isoformat(), "dryRun": True}
    try:
        async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:
            mine = {"Authorization": f"Bearer {ours}"}
            judge = (await http.post("/v1/judges", headers=mine, json={"name": "J", "criteria": "Good?"})).json()
            group = (await http.post("/v1/scorer-groups", headers=mine, json={
                "name": "Past", "members": [{"kind": "judge", "refId": judge["id"], "weight": 1}],
                "online": {"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}})).json()
            said = (await http.post(f"/v1/scorer-groups/{group['id']}/backfills", headers=mine, json=window)).json()
            asked = await http.post(f"/v1/scorer-groups/{group['id']}/backfills",
                                    headers={"Authorization": f"Bearer {theirs}"}, json=window)
            sql = await http.post(f"/v1/scorer-groups/{group['id']}/backfills", headers=mine,
                                  json={**window, "dryRun": "yes; DROP"})
    finally:
        api.stop()
    estimate = said["estimate"]
    assert set(estimate) == {"exact", "traces", "pairs", "pairsError", "relativeError", "judgeCalls", "tokens",
                             "cost", "currency", "basis", "capped"}, "no count of the shared topic's records"
    assert (estimate["exact"], estimate["traces"], estimate["pairs"]) == (True, 25, 25), "its own traces only"
    assert 100 not in estimate.values() and 75 not in estimate.values()
    assert asked.status_code == 404, "another project's group: not found, as its jobs are"
    assert sql.status_code == 400 and "dryRun" in sql.text
    assert bench.judge.requests == [], "no judge called"
