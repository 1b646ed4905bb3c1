"""End to end: a group created through the API (with the SDK) scores live traffic in a running
worker, and a change through the API reaches the worker without a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scorer_groups import Client
from tests.support.api_process import ApiProcess, create_key
from tests.support.harness import WorkerProcess, produce, read_topic, worker_env

pytestmark = pytest.mark.integration


def trace(i: int, project: str, text: str) -> tuple[bytes, bytes]:
    import orjson

    value = {"traceId": f"t-{project}-{i}", "projectId": project, "agentId": "bot",
             "timestamp": "2026-12-02T13:00:00Z",
             "spans": [{"spanId": "r", "parentSpanId": None, "name": "agent.run", "input": "q", "output": text}]}
    return value["traceId"].encode(), orjson.dumps(value)


async def test_a_group_created_through_the_api_scores_live_traffic(
        redis_db_url: str, kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    url = redis_db_url
    env = worker_env(kafka_bootstrap, url, unique, topic_partitions=2)
    api = ApiProcess(url, tmp_path / "api.log").start()
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        with Client(api.url, create_key(url, "--project", "p-live")) as client:
            thanks = client.monitor.patterns.create(name="Thanks", polarity="proper", contains=["thank you"])
            email = client.monitor.patterns.create(name="Email", polarity="failure", template="email")
            group = client.monitor.scorer_groups.create(
                "Courtesy", members=[{"kind": "pattern", "refId": thanks.id, "weight": 1, "gate": False},
                                     {"kind": "pattern", "refId": email.id, "weight": 0, "gate": True}],
                online={"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"})
            texts = ["thank you!", "no", "thank you, mail me at a.b@example.com"]
            await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                          [trace(i, "p-live", t) for i, t in enumerate(texts)] + [trace(9, "p-other", "thank you")])

            def ours(values: list[Any]) -> list[Any]:
                return [v for v in values if v["groupId"] == group.id]

            ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                       until=lambda v: len(ours(v)) >= 3, settle_s=1)
            by_trace = {r["traceId"]: r["rating"] for r in ours(ratings)}
            assert by_trace == {"t-p-live-0": 10.0, "t-p-live-1": 0.0, "t-p-live-2": 0.0}, \
                "the proper pattern scores, the email tripwire gates; p-other's trace is not this group's"
            signals = await read_topic(kafka_bootstrap, env["SGW_SIGNALS_TOPIC"],
                                       until=lambda v: len(ours(v)) >= 2, settle_s=1)
            assert sorted(s["traceId"] for s in ours(signals)) == ["t-p-live-1", "t-p-live-2"]

            # Live scoring off through the API, then a second live group: any trace the second one
            # rates was scored with a catalog where the first is off (catalog versions only grow).
            client.monitor.scorer_groups.update(group.id, online={"enabled": False})
            chart = client.monitor.scorer_groups.ratings(group.id, window="1h")
            assert chart.count == 3 and chart.below_threshold == 2
            marker = client.monitor.scorer_groups.create(
                "Marker", members=[{"kind": "pattern", "refId": thanks.id, "weight": 1, "gate": False}],
                online={"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low"})
            marked: list[Any] = []
            for i in range(20, 40):  # until the worker has the new catalog
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(i, "p-live", "thank you")])
                values = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=3,
                                          until=lambda v: any(r["groupId"] == marker.id for r in v))
                marked = [r["traceId"] for r in values if r["groupId"] == marker.id]
                if marked:
                    break
            assert marked, "the group created through the API never reached the worker"
            assert not [r for r in ours(values) if r["traceId"] in marked], "no rating once live scoring is off"
    finally:
        worker.stop()
        api.stop()
