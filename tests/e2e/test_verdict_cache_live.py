"""The verdict cache on live traffic, in the worker on the real broker and Redis, judges
through the local judge server: ten traces answering the same make one judge call, ten ratings and
one reservation - nine saying whose call paid; the same answer in another project, or once the
judge's criteria changed, is asked afresh; a judge's error is never kept; a redelivery calls
nothing; a judge with its cache off is asked every time."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.stores.claims import Claims
from devtools.judge_server import Behaviour, JudgeServer
from services.groups import MonitorClient
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 2, "severity": "high"}
DAY = 86_400


def catalog(criteria: str = "Is the answer right?") -> dict[str, Any]:
    def group(project: str, judge: str) -> dict[str, Any]:
        return {"id": f"g-{project}-{judge}", "name": f"{project} {judge}", "projectId": project, "online": ONLINE,
                "members": [{"kind": "judge", "refId": judge, "weight": 1}]}

    return {"judges": [{"id": "right", "name": "Right", "criteria": criteria},
                       {"id": "fresh", "name": "Always asked", "criteria": "Is it polite?", "cache": False}],
            "groups": [group("p-a", "right"), group("p-b", "right"), group("p-c", "fresh")],
            "budgets": [{"projectId": p, "judgeCallsPerWindow": 1000, "windowSeconds": DAY}
                        for p in ("p-a", "p-b", "p-c")]}


def record(project: str, trace_id: str, output: str) -> tuple[bytes, bytes]:
    return trace_id.encode(), orjson.dumps({
        "traceId": trace_id, "projectId": project, "agentId": "faq", "timestamp": "2026-12-06T10:00:00Z",
        "spans": [{"spanId": "r", "input": "How do I reset my password?", "output": output}]})


@pytest.fixture
async def catalog_url(redis_db_url: str) -> AsyncIterator[str]:
    async with catalog_db(redis_db_url, catalog()) as url:
        yield url


async def test_the_same_verdict_is_paid_once_per_project_and_judge_revision(
        catalog_url: str, kafka_bootstrap: str, unique: str, judge: JudgeServer, tmp_path: Path) -> None:
    judge.set_default(Behaviour.deterministic(delay=0.2))  # the first call is still under way as the rest come
    env = worker_env(kafka_bootstrap, catalog_url, unique, judge_base_url=judge.base_url, judge_timeout_s=5,
                     commit_interval_s=0.2)
    topic, ratings_topic = env["SGW_TRACES_TOPIC"], env["SGW_RATINGS_TOPIC"]
    same = "Click 'Forgot password' [[rating=8]] [[key=faq]]"
    worker = WorkerProcess(env).start(tmp_path)
    redis = connect(catalog_url)
    try:
        worker.wait_ready()
        # 1. Ten traces, one answer: one call, ten ratings, one reservation.
        await produce(kafka_bootstrap, topic, [record("p-a", f"a-{i}", same) for i in range(10)])
        first = await read_topic(kafka_bootstrap, ratings_topic, until=lambda v: len(v) >= 10, settle_s=1)
        assert judge.calls_by_key["faq"] == 1, "ten traces answering the same: one judge call"
        spent_a = await Claims(redis).budget_used("p-a", DAY)

        # 2. A redelivery calls nothing; the same answer in another project is asked afresh.
        await produce(kafka_bootstrap, topic, [record("p-a", "a-0", same), record("p-b", "b-0", same)])
        await read_topic(kafka_bootstrap, ratings_topic, until=lambda v: len(v) >= 11, settle_s=1)
        assert judge.calls_by_key["faq"] == 2, "another project's same answer is its own call; a redelivery none"

        # 3. A judge error is not kept: the same answer is asked again, and then kept.
        judge.script(Behaviour.content("I would rather not say"))
        await produce(kafka_bootstrap, topic, [record("p-a", "err-1", "Reboot it [[key=err]]")])
        await read_topic(kafka_bootstrap, ratings_topic, until=lambda v: len(v) >= 12, settle_s=0.5)
        await produce(kafka_bootstrap, topic, [record("p-a", "err-2", "Reboot it [[key=err]]")])
        await read_topic(kafka_bootstrap, ratings_topic, until=lambda v: len(v) >= 13, settle_s=0.5)
        await produce(kafka_bootstrap, topic, [record("p-a", "err-3", "Reboot it [[key=err]]")])
        await read_topic(kafka_bootstrap, ratings_topic, until=lambda v: len(v) >= 14, settle_s=0.5)
        assert judge.calls_by_key["err"] == 2, "the error was not kept; the verdict after it was"

        # 4. A judge with its cache off is asked every time.
        await produce(kafka_bootstrap, topic, [record("p-c", f"c-{i}", "Sure [[key=polite]]") for i in range(3)])
        await read_topic(kafka_bootstrap, ratings_topic, until=lambda v: len(v) >= 17, settle_s=0.5)
        assert judge.calls_by_key["polite"] == 3, '"cache": false: every trace is asked'

        # 5. The judge's criteria change: the same answer is another question, asked afresh.
        await MonitorClient(redis).apply(catalog("Is the answer right and complete?"))
        await worker_catalog_reloaded(kafka_bootstrap, topic, ratings_topic, same)
        assert judge.calls_by_key["faq"] == 3, "a changed rubric asks again"
        ratings = await read_topic(kafka_bootstrap, ratings_topic, until=lambda v: len(v) >= 18, settle_s=0.5)
        metrics_text = worker.metrics()
        saved = await Claims(redis).saved("p-a", DAY)
    finally:
        await redis.aclose()
        assert worker.stop() == 0, worker.logs()

    assert spent_a == 1, "the project's budget reserved once for the ten"
    assert len(first) == 10 and {r["rating"] for r in first} == {8.0}, "ten ratings, the one verdict"
    paid = [r for r in first if "cached" not in r["members"][0]]
    assert len(paid) == 1, "one rating paid for the verdict"
    cached = [r["members"][0] for r in first if r["members"][0].get("cached")]
    assert len(cached) == 9 and {m["cachedFrom"] for m in cached} == {paid[0]["id"]}, \
        "nine say the verdict was paid for, and by which rating"
    assert all("usage" not in m for m in cached), "a cached verdict spends no tokens of its own"
    b = [r for r in ratings if r["projectId"] == "p-b"]
    assert len(b) == 1 and "cached" not in b[0]["members"][0], "another project never reads this one's verdicts"
    hits = metric(metrics_text, "sgw_judge_cache_lookups_total", project="p-a", result="hit")
    misses = metric(metrics_text, "sgw_judge_cache_lookups_total", project="p-a", result="miss")
    assert (hits, misses) == (10, 4), "9 of the ten, the verdict after the error; the ten's first, two errors, the new rubric"
    assert metric(metrics_text, "sgw_judge_cache_saved_calls_total", project="p-a") == hits
    tokens = metric(metrics_text, "sgw_judge_cache_saved_tokens_total", project="p-a")
    assert saved == (10, tokens) and tokens > 0, "the budget window counts what the cache saved, calls and tokens"


async def worker_catalog_reloaded(bootstrap: str, topic: str, ratings_topic: str, output: str) -> None:
    """Send the answer again under the changed rubric (once the worker has it: within a second)."""
    await asyncio.sleep(1.5)
    await produce(bootstrap, topic, [record("p-a", "a-after", output)])
    await read_topic(bootstrap, ratings_topic, until=lambda v: any(r["traceId"] == "a-after" for r in v), settle_s=0.5)


def metric(text: str, name: str, **labels: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()))
