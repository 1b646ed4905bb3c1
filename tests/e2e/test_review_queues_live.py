"""Review queues in the live worker (a worker subprocess on the real broker and Redis):
a result enters a queue when it is published - below the threshold into a "below" queue, the
queue's sample into a sampled one, and nothing else - once, through a redelivery; a queue at its
capacity turns the rest away and counts them; an item shows what the group saw and its verdict."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from adapters.stores import keys
from adapters.stores.review_items import ReviewItems
from scorer_groups.review_queues import ReviewQueue
from tests.support.api_process import ApiProcess, create_key
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

PROJECT = "p-review"
TRACES = 60
APOLOGIES = {f"t-{i}" for i in range(0, TRACES, 4)}  # 15 of 60 answer with an apology: a score of 0
ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}
CATALOG: dict[str, Any] = {
    "patterns": [{"id": "sorry", "name": "Apology", "polarity": "failure", "contains": ["sorry"],
                  "projectId": PROJECT}],
    "groups": [{"id": "tone", "name": "Tone", "projectId": PROJECT, "online": ONLINE,
                "members": [{"kind": "pattern", "refId": "sorry", "weight": 1}]}],
    "queues": [
        {"id": "low", "name": "Below", "projectId": PROJECT, "groupIds": ["tone"], "rule": {"below": True}},
        {"id": "some", "name": "Sample", "projectId": PROJECT, "groupIds": ["tone"], "rule": {"sampleRate": 0.3}},
        {"id": "small", "name": "Small", "projectId": PROJECT, "groupIds": ["tone"], "rule": {"below": True},
         "capacity": 5}],
}


def trace(trace_id: str) -> tuple[bytes, bytes]:
    answer = "I am sorry, I cannot help with that." if trace_id in APOLOGIES else "Your order ships today."
    return trace_id.encode(), orjson.dumps({
        "traceId": trace_id, "projectId": PROJECT, "agentId": "support", "timestamp": "2026-12-06T09:00:00Z",
        "spans": [{"spanId": "root", "name": "agent.run", "input": f"Where is order {trace_id}?",
                   "output": answer}]})


def in_sample(trace_id: str, rate: float) -> bool:
    """The queues' sample, written from its definition: blake2b("trace:<id>" 0x1f "review-queues")."""
    digest = hashlib.blake2b(f"trace:{trace_id}".encode() + b"\x1f" + b"review-queues", digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / 2**53 < rate


@pytest.fixture
async def catalog_url(redis_db_url: str) -> AsyncIterator[str]:
    async with catalog_db(redis_db_url, CATALOG) as url:
        yield url


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_results_enter_their_queues_once_as_the_rules_say(catalog_url: str, kafka_bootstrap: str, unique: str,
                                                                tmp_path: Path) -> None:
    env = worker_env(kafka_bootstrap, catalog_url, unique, commit_interval_s=0.2)
    worker = WorkerProcess(env).start(tmp_path)
    traces = [trace(f"t-{i}") for i in range(TRACES)]
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], traces)
        ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= TRACES,
                                   settle_s=1)
        redis = connect(env["SGW_REDIS_URL"])
        store = ReviewItems(redis)
        queues = {q: ReviewQueue.model_validate(doc) for doc in CATALOG["queues"] for q in [doc["id"]]}
        before = {q: await store.counts(queues[q]) for q in ("low", "some", "small")}
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], traces)  # redelivered: nothing new
        await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= TRACES, settle_s=3)
        low, _ = await store.page(queues["low"], limit=200)
        some, _ = await store.page(queues["some"], limit=200)
        small, _ = await store.page(queues["small"], limit=200)
        after = {q: await store.counts(queues[q]) for q in ("low", "some", "small")}
        ttl = await redis.ttl(keys.review_items(keys.review_tag(PROJECT, "low")))
        await redis.aclose()
        metrics_text = worker.metrics()
    finally:
        assert worker.stop() == 0, worker.logs()

    by_trace = {r["traceId"]: r for r in ratings}
    assert {r["rating"] for t, r in by_trace.items() if t in APOLOGIES} == {0.0}
    assert {i.subject.trace_id for i in low} == APOLOGIES, "below the threshold, and nothing else"
    assert {i.reason for i in low} == {"below"}
    sampled = {f"t-{i}" for i in range(TRACES) if in_sample(f"t-{i}", 0.3)}
    assert 8 <= len(sampled) <= 30
    assert {i.subject.trace_id for i in some} == sampled and {i.reason for i in some} == {"sample"}
    assert len(small) == 5 and {i.subject.trace_id for i in small} <= APOLOGIES, "at capacity, the rest turned away"
    assert after == before, "a redelivered trace makes no second item and counts nothing"
    assert after["small"] == {"open": 5, "taken": 5, "turnedAway": len(APOLOGIES) - 5}
    assert after["low"] == {"open": len(APOLOGIES), "taken": len(APOLOGIES), "turnedAway": 0}
    assert metric(metrics_text, "sgw_review_items_total", project=PROJECT, outcome="turned_away") == len(APOLOGIES) - 5
    assert metric(metrics_text, "sgw_review_items_total", project=PROJECT, outcome="taken") == \
        len(APOLOGIES) * 2 + len(sampled) - (len(APOLOGIES) - 5)
    assert 29 * 86_400 < ttl <= 30 * 86_400, "kept keepDays (30 by default)"

    item = next(i for i in low if i.subject.trace_id == "t-4")
    assert (item.queue_id, item.project_id, item.group_id, item.origin) == ("low", PROJECT, "tone", "live")
    assert item.id.startswith("low:")
    assert item.subject.input == "Where is order t-4?" and item.subject.output == "I am sorry, I cannot help with that."
    assert item.rating.id == by_trace["t-4"]["id"] == item.rating_id and item.rating.rating == 0.0
    assert item.rating.members[0].name == "Apology" and item.rating.members[0].goodness == 0.0


async def test_every_label_version_reaches_the_labels_topic_through_restarts(
        catalog_url: str, kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    """Labels are kept in Redis when the reviewer is answered, and exported by the workers: the API
    and the worker restarted, a label given while no worker ran reaches the topic all the same."""
    env = worker_env(kafka_bootstrap, catalog_url, unique, commit_interval_s=0.2)
    worker = WorkerProcess(env, name="first").start(tmp_path)
    reviewer = create_key(catalog_url, "--project", PROJECT, "--role", "reviewer", "--name", "ann")
    api = ApiProcess(catalog_url, tmp_path / "api.log").start()
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(f"t-{i}") for i in range(8)])
        await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 8, settle_s=1)
        with api.client(reviewer) as ann:
            first = ann.post("/v1/review-queues/low/next").json()["item"]["id"]
            assert ann.put(f"/v1/review-items/{first}/labels/me", json={"rating": 2, "comment": "curt"}).status_code \
                == 200
        assert worker.stop() == 0, worker.logs()
        api.stop()
        api.start()  # a new API process; no worker runs now
        with api.client(reviewer) as ann:
            second = ann.post("/v1/review-queues/low/next").json()["item"]["id"]
            assert second != first
            assert ann.put(f"/v1/review-items/{second}/labels/me", json={"rating": 3}).status_code == 200
        worker = WorkerProcess(env, name="second").start(tmp_path)
        worker.wait_ready()
        labels = await read_topic(kafka_bootstrap, env["SGW_LABELS_TOPIC"], until=lambda v: len(v) >= 2,
                                  settle_s=2, timeout_s=60)
    finally:
        api.stop()
        assert worker.stop() == 0, worker.logs()
    versions = sorted((v["itemId"], v["version"], v["rating"], v["reviewer"]) for v in labels)
    assert sorted(set(versions)) == sorted([(first, 1, 2.0, "ann"), (second, 1, 3.0, "ann")])
    assert all(v["projectId"] == PROJECT and v["queueId"] == "low" and v["groupId"] == "tone" for v in labels)
