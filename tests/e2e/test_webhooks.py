"""Webhook deliveries reach the agents' alert channels: signed with the channel's secret,
retried, and dead-lettered with the reason when they cannot be made."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest
from standardwebhooks import Webhook

from tests.e2e.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.http_fakes import Reply, ScriptedServer

pytestmark = pytest.mark.integration

SECRET = "whsec_c2lnbmluZy1rZXktb2YtdGhlLWhlYWx0aHktY2hhbm5lbA=="


@pytest.fixture
def receivers() -> Iterator[tuple[ScriptedServer, ScriptedServer]]:
    with ScriptedServer(default=Reply(body={"ok": True})) as ok, \
            ScriptedServer(default=Reply(status=500, body={"error": "down"})) as failing:
        yield ok, failing


@pytest.fixture
async def env(kafka_bootstrap: str, redis_url: str, unique: str,
              receivers: tuple[ScriptedServer, ScriptedServer]) -> AsyncIterator[dict[str, str]]:
    ok, failing = receivers
    async with catalog_db(redis_url, 8, {
        "patterns": [{"id": "email", "name": "Email", "polarity": "failure", "template": "email"}],
        "groups": [{"id": "pii", "name": "PII", "projectId": "p-w",
                    "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "critical"},
                    "members": [{"kind": "pattern", "refId": "email", "weight": 1, "gate": True}]}],
        "channels": [{"agentId": "agent-w", "url": ok.url + "/hook", "secret": SECRET},
                     {"agentId": "agent-w", "url": failing.url + "/hook"},
                     {"agentId": "agent-w", "url": "http://10.1.2.3/hook"}],
    }) as url:
        yield worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8")


async def test_signals_page_the_agents_channels(env: dict[str, str], kafka_bootstrap: str, tmp_path: Path,
                                                receivers: tuple[ScriptedServer, ScriptedServer]) -> None:
    ok, failing = receivers
    trace = {"traceId": "t-leak", "projectId": "p-w", "agentId": "agent-w", "timestamp": "2026-12-02T13:00:00Z",
             "spans": [{"spanId": "r", "input": "who?", "output": "write to jane@example.com"}]}
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [(b"t-leak", orjson.dumps(trace))])
        failed = await read_topic(kafka_bootstrap, env["SGW_WEBHOOKS_DLQ_TOPIC"], until=lambda v: len(v) >= 2,
                                  timeout_s=60)
        deadline = time.monotonic() + 10
        while not ok.requests and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        assert worker.stop() == 0, worker.logs()

    assert len(ok.requests) == 1
    hook = ok.requests[0]
    body = hook.json()
    assert hook.path == "/hook" and body["event"] == "scorer_group.signal"
    assert body["signal"]["key"] == "scorer-group:pii" and body["signal"]["rating"] == 0.0
    assert body["signal"]["severity"] == "critical" and hook.headers["webhook-id"] == body["id"]
    assert Webhook(SECRET).verify(hook.body, hook.headers) == body, "Standard Webhooks signature verifies"
    assert not any(name.startswith("x-sgw-") for name in hook.headers), "the old headers are retired"
    assert SECRET not in hook.body.decode()

    assert len(failing.requests) == 5, "retried, then given up"
    assert "webhook-signature" not in failing.requests[0].headers, "a channel without a secret is not signed"
    assert len({r.headers["webhook-id"] for r in failing.requests}) == 1, "every retry carries the same id"
    reasons = {f["reason"]: f for f in failed}
    assert set(reasons) == {"delivery_failed", "url_refused"}
    assert "HTTP 500" in reasons["delivery_failed"]["error"] and "after 5 attempts" in reasons["delivery_failed"]["error"]
    assert "10.1.2.3" in reasons["url_refused"]["error"]
    assert json.dumps(failed).count(SECRET) == 0
