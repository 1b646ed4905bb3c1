"""Spend in money on live traffic (issue 58, first step), in the worker on the real broker and
Redis, judges through the local judge server (its token counts are word counts): a priced
judge's member says its exact cost beside its tokens, and sgw_judge_cost_total counts the same by
project, group and model; an unpriced model's cost is null and counted nowhere - never 0."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from deploy.judge_server import JudgeServer
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env

pytestmark = pytest.mark.integration

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 2, "severity": "high"}
PRICES = '{"judge-priced": {"input": 2.5, "output": 10}}'
CATALOG: dict[str, Any] = {
    "judges": [{"id": "priced", "name": "Priced", "criteria": "Right?", "model": "judge-priced"},
               {"id": "unpriced", "name": "Unpriced", "criteria": "Right?", "model": "judge-unpriced"}],
    "groups": [{"id": f"g-{j}", "name": j, "projectId": "p-money", "online": ONLINE,
                "members": [{"kind": "judge", "refId": j, "weight": 1}]} for j in ("priced", "unpriced")]}


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer() as s:
        yield s


@pytest.fixture
async def catalog_url(redis_db_url: str) -> AsyncIterator[str]:
    async with catalog_db(redis_db_url, CATALOG) as url:
        yield url


async def test_a_priced_judge_says_its_exact_cost_and_an_unpriced_one_says_unknown(
        catalog_url: str, kafka_bootstrap: str, unique: str, judge: JudgeServer, tmp_path: Path) -> None:
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


def metric(text: str, name: str, **labels: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()))
