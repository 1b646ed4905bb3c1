"""Spend in money on live traffic, in the worker on the real broker and Redis, judges
through the local judge server (its token counts are word counts): a priced judge's member says
its exact cost beside its tokens, and sgw_judge_cost_total and the group's history count the same
by project, group (member) and model; an unpriced model's cost is null and counted nowhere - never
0. A money budget skips what would pass it and settles to what the calls cost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from devtools.judge_server import JudgeServer
from tests.support.harness import WorkerProcess, catalog_db, connect, produce, read_topic, worker_env

pytestmark = pytest.mark.integration

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 2, "severity": "high"}
PRICES = '{"judge-priced": {"input": 2.5, "output": 10}}'
CATALOG: dict[str, Any] = {
    "judges": [{"id": "priced", "name": "Priced", "criteria": "Right?", "model": "judge-priced"},
               {"id": "unpriced", "name": "Unpriced", "criteria": "Right?", "model": "judge-unpriced"}],
    "groups": [{"id": f"g-{j}", "name": j, "projectId": "p-money", "online": ONLINE,
                "members": [{"kind": "judge", "refId": j, "weight": 1}]} for j in ("priced", "unpriced")]}


@pytest.fixture
async def catalog_url(redis_db_url: str) -> AsyncIterator[str]:
    async with catalog_db(redis_db_url, CATALOG) as url:
        yield url


async def test_a_priced_judge_says_its_exact_cost_and_an_unpriced_one_says_unknown(
        catalog_url: str, kafka_bootstrap: str, unique: str, judge: JudgeServer, tmp_path: Path,
        redis_db_url: str) -> None:
    env = worker_env(kafka_bootstrap, catalog_url, unique, judge_base_url=judge.base_url, judge_prices=PRICES,
                     commit_interval_s=0.2)
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        trace = {"traceId": "t-1", "projectId": "p-money", "agentId": "a", "timestamp": "2026-12-06T10:00:00Z",
                 "spans": [{"spanId": "r", "input": "Where is it?", "output": "On its way [[rating=8]]"}]}
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [(b"t-1", orjson.dumps(trace))])
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 2, settle_s=1)
        metrics_text = worker.metrics()
    finally:
        assert worker.stop() == 0, worker.logs()
    by_group = {r["groupId"]: r["members"][0]["usage"] for r in ratings}
    priced, unpriced = by_group["g-priced"], by_group["g-unpriced"]
    expected = (priced["promptTokens"] * 2.5 + priced["completionTokens"] * 10) / 1e6
    assert priced["promptTokens"] > 0 and priced["cost"] == pytest.approx(expected)
    assert unpriced["promptTokens"] > 0 and unpriced["cost"] is None, "unknown, not free"
    assert metric(metrics_text, "sgw_judge_cost_total", project="p-money", group="g-priced",
                  model="judge-priced") == pytest.approx(expected)
    assert metric(metrics_text, "sgw_judge_cost_total", group="g-unpriced") == 0, "no series for an unknown cost"
    redis = connect(redis_db_url)
    try:  # the group's history: the chart's spend, by member; an unknown cost is counted as unknown
        store = RatingsStore(redis)
        spent, unknown = (await store.history("g-priced", "1h")).wire(), (await store.history("g-unpriced", "1h")).wire()
    finally:
        await redis.aclose()
    assert spent["cost"] == pytest.approx(expected) and spent["memberCost"] == {"priced": pytest.approx(expected)}
    assert spent["costPerResult"] == pytest.approx(expected) and spent["unpricedCalls"] == 0
    assert (unknown["cost"], unknown["unpricedCalls"]) == (0, 1), "an unpriced call: unknown, never free"


MONEY_CATALOG: dict[str, Any] = {
    "judges": [{"id": "priced", "name": "Priced", "criteria": "Right?", "model": "judge-priced"}],
    "groups": [{"id": "g-capped", "name": "Capped", "projectId": "p-capped", "online": ONLINE,
                "members": [{"kind": "judge", "refId": "priced", "weight": 1}]}],
    # Room for about one call's cost ceiling (its prompt's bytes and 512 answer tokens at $2.5 per
    # million, the answer's again at the output price's $7.5 more): ~$0.0055 a call.
    "budgets": [{"projectId": "p-capped", "judgeCallsPerWindow": 1000, "judgeCostPerWindow": 0.008}]}


async def test_a_money_budget_skips_what_would_pass_it_and_settles_to_the_calls_cost(
        kafka_bootstrap: str, unique: str, judge: JudgeServer, tmp_path: Path, redis_db_url: str) -> None:
    async with catalog_db(redis_db_url, MONEY_CATALOG) as url:
        env = worker_env(kafka_bootstrap, url, unique, judge_base_url=judge.base_url, judge_prices=PRICES,
                         commit_interval_s=0.2)
        worker = WorkerProcess(env).start(tmp_path)
        try:
            worker.wait_ready()
            traces = [{"traceId": f"t-{i}", "projectId": "p-capped", "agentId": "a",
                       "timestamp": "2026-12-06T10:00:00Z",
                       "spans": [{"spanId": "r", "input": "Where is it?", "output": f"On its way {i} [[rating=8]]"}]}
                      for i in range(12)]
            await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [(t["traceId"].encode(), orjson.dumps(t))
                                                                     for t in traces])
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and worker.metric("sgw_groups_scored_total", group="g-capped") \
                    + worker.metric("sgw_groups_skipped_total", group="g-capped", why="budget") < 12:
                await asyncio.sleep(0.2)  # every pair decided: rated, or skipped for budget
            ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 1,
                                       settle_s=1)
        finally:
            assert worker.stop() == 0, worker.logs()
        redis = connect(url)
        try:
            history = (await RatingsStore(redis).history("g-capped", "1h")).wire()
            settled = await Claims(redis).cost_used("p-capped", 3600)
        finally:
            await redis.aclose()
    cost = sum(r["members"][0]["usage"]["cost"] for r in ratings)
    assert 1 <= len(ratings) < 12 and history["skipped"] == 12 - len(ratings), "the rest skipped for budget, whole"
    assert settled == pytest.approx(cost * 1e9, abs=len(ratings)), "settled to what the calls cost (nanos)"
    assert settled <= 0.008 * 1e9 and history["cost"] == pytest.approx(cost)


def metric(text: str, name: str, **labels: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()))
