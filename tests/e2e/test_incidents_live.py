"""Incidents end to end: the real worker on the real broker and Redis, a webhook
receiver per channel format. A group in window mode is fed a dip, then good traffic: each
channel gets exactly one opened and one resolved delivery - none per trace - while every
result below the threshold is still a Signal on the signals topic (the record). The same with
three workers, one of them killed (SIGKILL) once the incident is open. A judge outage (a
must-pass judge answering 503) opens one coverage incident, and its return resolves it."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from devtools.judge_server import Behaviour, JudgeServer
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.http_fakes import Reply, ScriptedServer

pytestmark = pytest.mark.integration

WINDOW_S = 60
SORRY = "I am so sorry, I apologize for that."


@pytest.fixture
def receivers() -> Iterator[dict[str, ScriptedServer]]:
    with ScriptedServer(default=Reply(body={"ok": True})) as std, ScriptedServer(default=Reply(body="ok")) as slack, \
            ScriptedServer(default=Reply(status=202, body={"status": "success"})) as pd:
        yield {"standard": std, "slack": slack, "pagerduty": pd}


def trace(n: int, output: str) -> tuple[bytes, bytes]:
    return f"t-{n}".encode(), orjson.dumps({
        "traceId": f"t-{n}", "projectId": "p-inc", "agentId": "support", "timestamp": "2026-12-05T06:00:00Z",
        "spans": [{"spanId": "r", "input": "q", "output": output}]})


@pytest.mark.parametrize("workers", [1, 3])
async def test_a_dip_pages_each_channel_once_when_it_opens_and_once_when_it_resolves(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path,
        receivers: dict[str, ScriptedServer], workers: int) -> None:
    online = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high", "alertMode": "window",
              "alertWindowSeconds": WINDOW_S, "alertMinResults": 5, "alertResolveAbove": 7}
    channels = [{"agentId": "support", "url": server.url + "/hook", "format": fmt, "projectId": "p-inc",
                 **({"routingKey": "R0UTINGKEY0123456789ABCDEFGHIJ"} if fmt == "pagerduty" else {})}
                for fmt, server in receivers.items()]
    async with catalog_db(redis_db_url, {
        "patterns": [{"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology",
                      "projectId": "p-inc"}],
        "groups": [{"id": "bar", "name": "Release bar", "projectId": "p-inc", "online": online,
                    "members": [{"kind": "pattern", "refId": "apology", "weight": 1}]}],
        "channels": channels,
    }) as url:
        env = worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8", incident_interval_s=1,
                         commit_interval_s=0.2)
        fleet = [WorkerProcess(env, name=f"worker-{n}").start(tmp_path) for n in range(workers)]
        try:
            for worker in fleet:
                worker.wait_ready()
            await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(n, SORRY) for n in range(8)])
            await until(lambda: all(len(s.requests) >= 1 for s in receivers.values()), 30, "the opening")
            opened_at = time.monotonic()
            if workers > 1:  # one of the watchers dies mid-incident: the others resolve it, once
                fleet[0].proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
                fleet[0].proc.wait()  # type: ignore[union-attr]
            # Good traffic from here; the dip leaves the window (and its bucket) within two windows.
            n = 100
            while not all(len(s.requests) >= 2 for s in receivers.values()):
                assert time.monotonic() - opened_at < 4 * WINDOW_S, "resolved in time"
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(n + i, "All done.") for i in range(3)])
                n += 3
                await asyncio.sleep(3)
            await asyncio.sleep(3)  # nothing more comes
            signals = await read_topic(kafka_bootstrap, env["SGW_SIGNALS_TOPIC"], until=lambda v: len(v) >= 10)
        finally:
            for worker in fleet[1:] if workers > 1 else fleet:
                worker.stop()

    std = [r.json() for r in receivers["standard"].requests]
    assert [b["type"] for b in std] == ["scorer_group.incident.opened", "scorer_group.incident.resolved"]
    assert std[0]["data"]["incidentId"] == std[1]["data"]["incidentId"] and std[0]["data"]["reason"] == "window_below"
    slack = [r.json()["text"] for r in receivers["slack"].requests]
    assert len(slack) == 2 and "incident opened" in slack[0] and "incident resolved" in slack[1]
    pd = [r.json() for r in receivers["pagerduty"].requests]
    assert [e["event_action"] for e in pd] == ["trigger", "resolve"]
    assert pd[0]["dedup_key"] == pd[1]["dedup_key"] == f"incident:{std[0]['data']['incidentId']}"
    per_result = [s for s in signals if s["reason"] == "below_threshold"]
    incidents = [(s["reason"], s["state"]) for s in signals if s["incidentId"]]
    assert len(per_result) == 8, "every result below the threshold is still a Signal (the record)"
    assert incidents == [("window_below", "opened"), ("window_below", "resolved")]


async def until(check: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_a_judge_outage_opens_one_coverage_incident_and_its_return_resolves_it(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path,
        receivers: dict[str, ScriptedServer]) -> None:
    online = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "high",
              "alertNoScoreRate": 0.5, "alertWindowSeconds": WINDOW_S, "alertMinResults": 5,
              "alertOnNoScore": False}  # (the per-result no-score Signal is the other way to hear it)
    std = receivers["standard"]
    with JudgeServer() as judge:
        judge.set_default(Behaviour.status(503))  # the judge is down
        async with catalog_db(redis_db_url, {
            "judges": [{"id": "quality", "name": "Quality", "criteria": "Helpful?", "projectId": "p-inc"}],
            "groups": [{"id": "gated", "name": "Gated", "projectId": "p-inc", "online": online,
                        "members": [{"kind": "judge", "refId": "quality", "weight": 1, "gate": True}]}],
            "channels": [{"agentId": "support", "url": std.url + "/hook", "projectId": "p-inc"}],
        }) as url:
            env = worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8", incident_interval_s=1,
                             judge_base_url=judge.base_url, judge_timeout_s=2, commit_interval_s=0.2)
            worker = WorkerProcess(env).start(tmp_path)
            try:
                worker.wait_ready()
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(n, "fine [[rating=8]]") for n in range(6)])
                await until(lambda: any(r.json()["type"] == "scorer_group.incident.opened" for r in std.requests),
                            60, "the coverage incident")
                judge.set_default(Behaviour.deterministic())  # back
                started, n = time.monotonic(), 100
                while not any(r.json()["type"] == "scorer_group.incident.resolved" for r in std.requests):
                    assert time.monotonic() - started < 4 * WINDOW_S, "resolved in time"
                    await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                                  [trace(n + i, "fine [[rating=8]]") for i in range(3)])
                    n += 3
                    await asyncio.sleep(3)
                await asyncio.sleep(3)
            finally:
                worker.stop()
    events = [(r.json()["type"], r.json()["data"]["reason"]) for r in std.requests
              if r.json()["type"].startswith("scorer_group.incident")]
    assert events == [("scorer_group.incident.opened", "coverage"), ("scorer_group.incident.resolved", "coverage")]
