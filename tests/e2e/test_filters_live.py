"""``online.filter`` in the live worker (a subprocess on the real broker and Redis, judges through
the local judge server): two groups with disjoint filters see disjoint traffic; a trace no group
wants spends nothing - no judge call, no claim, no key in Redis - and, when its routing headers
say so, is not even parsed; what each group matched is counted in its ratings buckets."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.stores.ratings import RatingsStore
from devtools.judge_server import JudgeServer
from scoring.filters import routing_headers
from scoring.subjects import Trace
from tests.support.harness import WorkerProcess, produce, read_topic
from tests.support.redis_clients import connect

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}
SUPPORT_IN_PRODUCTION = {"all": [{"field": "agentId", "op": "eq", "value": "support"},
                                 {"field": "metadata.environment", "op": "eq", "value": "production"}]}
SALES = {"field": "agentId", "op": "in", "value": ["sales", "sales-eu"]}
CATALOG: dict[str, Any] = {
    "judges": [{"id": "help", "name": "Helpfulness", "criteria": "Helpful?"}],
    "groups": [
        {"id": "g-support", "name": "Support in production", "projectId": "p-f",
         "online": {**ONLINE, "filter": SUPPORT_IN_PRODUCTION}, "members": [{"kind": "judge", "refId": "help", "weight": 1}]},
        {"id": "g-sales", "name": "Sales", "projectId": "p-f",
         "online": {**ONLINE, "filter": SALES}, "members": [{"kind": "judge", "refId": "help", "weight": 1}]}],
}


def trace(name: str, agent: str, environment: str) -> dict[str, Any]:
    return {"traceId": name, "projectId": "p-f", "agentId": agent, "timestamp": "2026-12-05T10:00:00Z",
            "metadata": {"environment": environment},
            "spans": [{"spanId": "r", "name": "agent.run", "input": "q", "output": f"ok [[rating=8]] [[key={name}]]"}]}


# env (tests/e2e/conftest.py): a worker's environment with this catalog and these settings
pytestmark = [pytest.mark.integration, pytest.mark.worker(CATALOG, judge_timeout_s=5, commit_interval_s=0.2)]


async def test_disjoint_filters_see_disjoint_traffic_and_filtered_traces_spend_nothing(
        env: dict[str, str], kafka_bootstrap: str, judge: JudgeServer, tmp_path: Path) -> None:
    support = [trace(f"support-{i}", "support", "production") for i in range(4)]
    sales = [trace(f"sales-{i}", "sales" if i % 2 else "sales-eu", "production") for i in range(3)]
    unwanted = ([trace(f"staging-{i}", "support", "staging") for i in range(3)]  # decided on the trace
                + [trace(f"internal-{i}", "internal-bot", "production") for i in range(5)])  # on the headers
    records = [(t["traceId"].encode(), orjson.dumps(t)) for t in support + sales + unwanted]
    headers: list[list[tuple[str, bytes]] | None] = [None] * len(records)
    for i, t in enumerate(support + sales + unwanted):
        if i % 2 or t["agentId"] == "internal-bot":  # some with routing headers, some without
            headers[i] = routing_headers(Trace.model_validate(t))
    # Garbage whose headers say no group wants it is never parsed; without headers it is refused.
    unparsed = routing_headers(Trace.model_validate(trace("internal-garbage", "internal-bot", "production")))
    records += [(b"internal-garbage", b"{not json"), (b"plain-garbage", b"{not json")]
    headers += [unparsed, None]

    worker = WorkerProcess(env).start(tmp_path)
    redis = connect(env["SGW_REDIS_URL"])
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], records, headers)
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 7,
                                   settle_s=2)
        dead = await read_topic(kafka_bootstrap, env["SGW_DLQ_TOPIC"], until=lambda v: len(v) >= 1, settle_s=1)
        store = RatingsStore(redis)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the matched counts are written on the loop's tick
            matched = {g: (await store.history(g, "1h")).matched for g in ("g-support", "g-sales")}
            if matched == {"g-support": 4, "g-sales": 3}:
                break
            await asyncio.sleep(0.2)
        keys = [k.decode() async for k in redis.scan_iter(count=1000)]
        metrics_text = worker.metrics()
    finally:
        await redis.aclose()
        code = worker.stop()
    assert code == 0, worker.logs()

    assert sorted((r["groupId"], r["traceId"]) for r in ratings) == sorted(
        [("g-support", t["traceId"]) for t in support] + [("g-sales", t["traceId"]) for t in sales])
    assert all(judge.calls_by_key[t["traceId"]] == 1 for t in support + sales)
    assert {r["origin"] for r in ratings} == {"live"}, "live scoring's ratings say so (a backfill's will not)"
    assert not [t["traceId"] for t in unwanted if judge.calls_by_key[t["traceId"]]], "a filtered trace calls no judge"
    assert not [k for k in keys if "staging-" in k or "internal-" in k], \
        "a filtered trace leaves no claim nor any other key in Redis"
    assert matched == {"g-support": 4, "g-sales": 3}, "the buckets count the traffic each group matched"
    assert [d["key"] for d in dead] == ["plain-garbage"], "garbage with unwanted routing headers is never parsed"
    assert metric(metrics_text, "sgw_traces_filtered_total", group="g-support") == len(sales) + len(unwanted) + 1
    assert metric(metrics_text, "sgw_traces_filtered_total", group="g-sales") == len(support) + len(unwanted) + 1


def metric(text: str, name: str, **labels: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()))
