"""A broken safety gate pages someone: a group whose must-pass member cannot score has no score
on every result, so no below-threshold Signal - instead its first result without a score raises
one Signal (reason no_score) naming the member and why, keyed like any Signal, and later ones
within the interval raise none. A group may opt out. The real worker on the real broker and Redis."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.stores.alerts import NoScoreAlerts
from services.groups import MonitorClient
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "critical"}


def catalog() -> dict[str, Any]:
    gate = {"kind": "judge", "refId": "safety", "weight": 1, "gate": True}
    polite = {"kind": "pattern", "refId": "polite", "weight": 1, "gate": False}
    return {
        "judges": [{"id": "safety", "name": "Safety", "criteria": "Safe?"}],
        "patterns": [{"id": "polite", "name": "Polite", "polarity": "failure", "contains": ["stupid"]}],
        "groups": [
            {"id": "gated", "name": "Gated", "projectId": "p-ns", "online": ONLINE, "members": [gate, polite]},
            {"id": "quiet", "name": "Quiet", "projectId": "p-ns", "online": {**ONLINE, "alertOnNoScore": False},
             "members": [gate, polite]},
        ],
    }


def trace(trace_id: str) -> tuple[bytes, bytes]:
    return trace_id.encode(), orjson.dumps({
        "traceId": trace_id, "projectId": "p-ns", "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
        "spans": [{"spanId": "r", "input": "q", "output": "a fine answer"}]})


async def test_a_gate_that_cannot_score_raises_one_no_score_signal_per_group(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    async with catalog_db(redis_db_url, catalog()) as url:
        redis = connect(url)
        await MonitorClient(redis).scorers.delete("judges", "safety")  # the must-pass judge is gone
        await redis.aclose()
        env = worker_env(kafka_bootstrap, url, f"ns-{unique}")
        worker = WorkerProcess(env).start(tmp_path)
        try:
            worker.wait_ready()
            await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(f"t-{i}") for i in range(4)])
            ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 8)
            signals = await read_topic(kafka_bootstrap, env["SGW_SIGNALS_TOPIC"], until=lambda v: len(v) >= 1,
                                       timeout_s=15, settle_s=3)
        finally:
            assert worker.stop() == 0, worker.logs()
    assert {r["rating"] for r in ratings} == {None}, "no result has a score"
    assert len(signals) == 1, signals  # one for the group, not one per result; none for the opted-out group
    (signal,) = signals
    assert (signal["key"], signal["reason"], signal["rating"], signal["severity"]) == (
        "scorer-group:gated", "no_score", None, "critical")
    assert signal["justification"] == 'No score: must-pass member "Safety" could not score (reference deleted)'


async def test_the_rate_limit_claims_one_signal_per_group_and_interval_and_a_redelivery_keeps_it(
        redis_db_url: str, unique: str) -> None:
    alerts = NoScoreAlerts(connect(redis_db_url), interval_s=60)
    first = await alerts.due([("p", "g", "s-1"), ("p", "g", "s-2"), ("p", "h", "s-3"), ("q", "g", "s-4")])
    assert first == {"s-1", "s-3", "s-4"}, "the first of each group, per project"
    assert await alerts.due([("p", "g", "s-1")]) == {"s-1"}, "the same Signal again (a redelivery) is due"
    assert await alerts.due([("p", "g", "s-5")]) == set(), "another within the interval is not"
    assert await alerts.due([]) == set()


async def test_pagerduty_opens_the_groups_incident_on_no_score_and_resolves_it_when_scores_return(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    from devtools.judge_server import JudgeServer
    from tests.support.http_fakes import Reply, ScriptedServer
    from tests.support.webhook_shapes import ROUTING_KEY, check_pagerduty_event

    with JudgeServer(default_rating=8) as judge, \
            ScriptedServer(default=Reply(status=202, body={"status": "success"})) as pd:
        bare = catalog()
        bare["groups"] = [g for g in bare["groups"] if g["id"] == "gated"]
        bare["channels"] = [{"agentId": "a", "projectId": "p-ns", "url": pd.url + "/pd", "format": "pagerduty",
                             "routingKey": ROUTING_KEY}]
        async with catalog_db(redis_db_url, bare) as url:
            redis = connect(url)
            client = MonitorClient(redis)
            await client.scorers.delete("judges", "safety")
            env = worker_env(kafka_bootstrap, url, f"ns-pd-{unique}", egress_allow="127.0.0.0/8",
                             judge_base_url=judge.base_url)
            worker = WorkerProcess(env).start(tmp_path)
            try:
                worker.wait_ready()
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace("t-0"), trace("t-1")])
                await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 2)
                deadline = time.monotonic() + 30
                while not pd.requests and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                # The gate's judge is back: the next result scores (8 >= 6) and resolves the incident.
                await client.apply({"judges": [{"id": "safety", "name": "Safety", "criteria": "Safe?"}]})
                await asyncio.sleep(2)  # the worker picks the change up within a second
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace("t-2")])
                while len(pd.requests) < 2 and time.monotonic() < deadline + 30:
                    await asyncio.sleep(0.2)
            finally:
                await redis.aclose()
                assert worker.stop() == 0, worker.logs()
    events = [r.json() for r in pd.requests]
    assert [e["event_action"] for e in events] == ["trigger", "resolve"], events
    for event in events:
        check_pagerduty_event(event)
    assert events[0]["dedup_key"] == events[1]["dedup_key"] == "scorer-group:gated"
    assert events[0]["payload"]["custom_details"]["reason"] == "no_score"
    assert events[0]["payload"]["summary"].startswith("Gated has no score: a must-pass member could not score")
