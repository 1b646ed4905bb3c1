"""Webhook deliveries reach the agents' alert channels: signed per Standard Webhooks (verified
with the reference ``standardwebhooks`` package), retried on a durable schedule in Redis,
dead-lettered with their attempt history, replayed from there, and isolated per channel."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from standardwebhooks import Webhook

from adapters.stores.catalog import CatalogStore
from scoring.results import Signal, WebhookDelivery, build_deliveries
from services.groups import MonitorClient
from tests.support.harness import ROOT, WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.http_fakes import Received, Reply, ScriptedServer
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

SECRET = "whsec_c2lnbmluZy1rZXktb2YtdGhlLWhlYWx0aHktY2hhbm5lbA=="
ROTATED = "whsec_dGhlLW5ldy1zZWNyZXQtYWZ0ZXItYS1yb3RhdGlvbi0x"


def signal(agent: str, n: int) -> Signal:
    return Signal(id=f"sig-{agent}-{n}", key="scorer-group:g", group_id="g", group_name="G", project_id="p-w",
                  agent_id=agent, scope="trace", trace_id=f"t-{n}", rating=2.0, alert_threshold=6.0,
                  severity="high", justification="Weighted blend: ...", rating_id=f"r-{n}",
                  raised_at=datetime.now(UTC))


async def publish(env: dict[str, str], kafka_bootstrap: str, deliveries: list[WebhookDelivery]) -> None:
    await produce(kafka_bootstrap, env["SGW_WEBHOOKS_TOPIC"],
                  [(d.agent_id.encode(), d.to_json()) for d in deliveries])


async def wait_for(check: Callable[[], bool], timeout_s: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def channel(agent: str, server: ScriptedServer, **extra: Any) -> dict[str, Any]:
    return {"agentId": agent, "url": server.url + "/hook", **extra}


# --- From a trace to a signed delivery ---------------------------------------------------------------

@pytest.fixture
def receivers() -> Iterator[tuple[ScriptedServer, ScriptedServer]]:
    with ScriptedServer(default=Reply(body={"ok": True})) as ok, \
            ScriptedServer(default=Reply(status=500, body={"error": "down"})) as failing:
        yield ok, failing


@pytest.fixture
async def env(kafka_bootstrap: str, redis_db_url: str, unique: str,
              receivers: tuple[ScriptedServer, ScriptedServer]) -> AsyncIterator[dict[str, str]]:
    ok, failing = receivers
    async with catalog_db(redis_db_url, {
        "patterns": [{"id": "email", "name": "Email", "polarity": "failure", "template": "email"}],
        "groups": [{"id": "pii", "name": "PII", "projectId": "p-w",
                    "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "critical"},
                    "members": [{"kind": "pattern", "refId": "email", "weight": 1, "gate": True}]}],
        "channels": [{"agentId": "agent-w", "url": ok.url + "/hook", "secret": SECRET},
                     {"agentId": "agent-w", "url": failing.url + "/hook"},
                     {"agentId": "agent-w", "url": "http://10.1.2.3/hook"}],
    }) as url:
        yield worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8",
                         webhook_retry_schedule="200ms,200ms",
                         webhook_link_template="https://app.example.com/groups/{groupId}/ratings/{ratingId}")


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
        await wait_for(lambda: bool(ok.requests), what="the healthy channel")
        published = await read_topic(kafka_bootstrap, env["SGW_WEBHOOKS_TOPIC"], until=lambda v: len(v) >= 3)
    finally:
        assert worker.stop() == 0, worker.logs()

    assert len(ok.requests) == 1
    hook = ok.requests[0]
    body = hook.json()
    [delivery] = [d for d in published if d["url"] == ok.url + "/hook"]
    assert hook.path == "/hook" and hook.headers["webhook-id"] == delivery["id"]
    assert body == {"type": "scorer_group.signal", "timestamp": delivery["signal"]["raisedAt"],
                    "data": {**delivery["signal"], "link": "https://app.example.com/groups/pii/ratings/"
                                                           + delivery["signal"]["ratingId"]}}
    assert body["data"]["key"] == "scorer-group:pii" and body["data"]["rating"] == 0.0
    assert body["data"]["severity"] == "critical"
    assert Webhook(SECRET).verify(hook.body, hook.headers) == body, "Standard Webhooks signature verifies"
    assert not any(name.startswith("x-sgw-") for name in hook.headers), "the old headers are retired"
    assert SECRET not in hook.body.decode()

    assert len(failing.requests) == 3, "the first attempt and one per wait of the schedule"
    assert "webhook-signature" not in failing.requests[0].headers, "a channel without a secret is not signed"
    assert len({r.headers["webhook-id"] for r in failing.requests}) == 1, "every retry carries the same id"
    reasons = {f["reason"]: f for f in failed}
    assert set(reasons) == {"delivery_failed", "url_refused"}
    exhausted = reasons["delivery_failed"]
    assert "HTTP 500" in exhausted["error"] and "after 3 attempts" in exhausted["error"]
    assert [(a["outcome"], a["status"]) for a in exhausted["attempts"]] == [("failed", 500)] * 3
    assert "10.1.2.3" in reasons["url_refused"]["error"]
    assert json.dumps(failed).count(SECRET) == 0


# --- What each answer leads to; replay -----------------------------------------------------------------

@pytest.fixture
def answers() -> Iterator[dict[str, ScriptedServer]]:
    servers = {
        "a-500": ScriptedServer(default=Reply(body={"ok": True})),
        "a-429": ScriptedServer(default=Reply(body={"ok": True})),
        "a-400": ScriptedServer(default=Reply(status=400, body={"error": "bad payload"})),
        "a-410": ScriptedServer(default=Reply(status=410, body={"error": "gone"})),
        "a-302": ScriptedServer(),
        "moved-to": ScriptedServer(default=Reply(body={"ok": True})),
    }
    for s in servers.values():
        s.start()
    # Its hiccup sets a cookie: the retry (and any other channel's delivery) must not carry it.
    servers["a-500"].script(Reply(status=500, body={"error": "hiccup"}, headers={"Set-Cookie": "session=a-500; Path=/"}))
    servers["a-429"].script(Reply(status=429, body={"error": "slow down"}, headers={"Retry-After": "3"}))
    servers["a-302"].default = Reply(status=302, body={}, headers={"Location": servers["moved-to"].url + "/hook"})
    try:
        yield servers
    finally:
        for s in servers.values():
            s.stop()


async def test_each_answer_is_handled_as_the_protocol_says_and_dead_letters_replay(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path,
        answers: dict[str, ScriptedServer]) -> None:
    agents = ["a-500", "a-429", "a-400", "a-410", "a-302"]
    catalog = {"channels": [channel(a, answers[a], secret=SECRET) for a in agents]}
    async with catalog_db(redis_db_url, catalog) as url:
        # a-500's secret is rotated: both secrets sign during the overlap
        rotation = connect(url)
        report = await MonitorClient(rotation).apply({"channels": [channel("a-500", answers["a-500"], secret=ROTATED)]})
        await rotation.aclose()
        assert report.changed == [f"channels/a-500|{answers['a-500'].url}/hook"]
        env = worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8",
                         webhook_retry_schedule="1s,1s")
        deliveries = {a: build_deliveries(signal(a, 1), [answers[a].url + "/hook"])[0] for a in agents}
        worker = WorkerProcess(env).start(tmp_path)
        try:
            worker.wait_ready()
            await publish(env, kafka_bootstrap, list(deliveries.values()))
            failed = await read_topic(kafka_bootstrap, env["SGW_WEBHOOKS_DLQ_TOPIC"], until=lambda v: len(v) >= 3,
                                      timeout_s=60, settle_s=1)
            await wait_for(lambda: len(answers["a-500"].requests) == 2 and len(answers["a-429"].requests) == 2,
                           what="the retried deliveries")
            gone = (await CatalogStore(connect(url)).snapshot()).channels_for("a-410")[0]
            disabled_metric = worker.metric("sgw_webhook_channels_disabled_total")

            # Replay: the receiver that refused is fixed; its dead letter is sent again.
            answers["a-400"].default = Reply(body={"ok": True})
            replay = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "worker.cli", "webhooks", "replay", "--channel", "a-400",
                "--since", "1h", cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            printed = (await replay.communicate())[0].decode()
            assert replay.returncode == 0, printed
            await wait_for(lambda: len(answers["a-400"].requests) == 2,
                           what=f"the replayed delivery; replay printed {printed}\n{worker.logs()}")
            deadline = time.monotonic() + 10  # the count follows the receiver's answer
            while (delivered := worker.metric("sgw_webhook_deliveries_total", outcome="delivered")) < 3 \
                    and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
        finally:
            assert worker.stop() == 0, worker.logs()

    def verified(received: list[Received], agent: str, secrets: tuple[str, ...] = (SECRET,)) -> None:
        assert {r.headers["webhook-id"] for r in received} == {deliveries[agent].id}, "one id on every attempt"
        for r in received:
            for secret in secrets:
                Webhook(secret).verify(r.body, r.headers)

    # 500: retried, then delivered; across a secret rotation receivers with either secret verify.
    verified(answers["a-500"].requests, "a-500", secrets=(SECRET, ROTATED))
    assert all(len(r.headers["webhook-signature"].split(" ")) == 2 for r in answers["a-500"].requests)
    assert not [r for s in answers.values() for r in s.requests if "cookie" in r.headers], "a cookie was sent back"
    # 429 with Retry-After: 3 - the next attempt waits for it rather than the 1 s schedule.
    first, second = answers["a-429"].requests
    verified([first, second], "a-429")
    assert second.at - first.at >= 2.5, "Retry-After honoured"
    # 400: final, no retry; replayed later under the same id.
    verified(answers["a-400"].requests, "a-400")
    assert "1 replayed" in printed and "http" not in printed.lower(), "replay prints no URL"
    # 410: one attempt, the channel disabled (catalog, metric), no retry.
    assert len(answers["a-410"].requests) == 1
    assert gone.disabled and "410" in (gone.disabled_reason or "") and disabled_metric == 1
    # 3xx: a failure; the redirect is never followed.
    assert len(answers["a-302"].requests) == 3 and answers["moved-to"].requests == []

    by_agent = {f["delivery"]["agentId"]: f for f in failed}
    assert {a: f["reason"] for a, f in by_agent.items()} == {
        "a-400": "rejected", "a-410": "channel_gone", "a-302": "delivery_failed"}
    assert [a["status"] for a in by_agent["a-400"]["attempts"]] == [400]
    assert [a["status"] for a in by_agent["a-302"]["attempts"]] == [302, 302, 302]
    assert "redirects are not followed" in by_agent["a-302"]["error"]
    assert delivered == 3, "a-500, a-429 and the replayed a-400"


# --- A receiver's huge answer ---------------------------------------------------------------------------

async def test_a_receiver_answering_8_mib_is_read_up_to_the_cut_and_its_status_decides(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    """Through the live sender, not ``post_capped`` alone: 8 MiB with 200 is one delivery, counted
    delivered; 8 MiB with 503 is retried on schedule and dead-lettered with each attempt's status.
    Read whole, the size error escaped the attempt: nothing recorded, the delivery resent after
    every lease."""
    huge = b"x" * (8 * 1024 * 1024)
    with ScriptedServer(default=Reply(body=huge)) as fine, \
            ScriptedServer(default=Reply(status=503, body=huge)) as busy:
        catalog = {"channels": [channel("a-huge-200", fine, secret=SECRET), channel("a-huge-503", busy, secret=SECRET)]}
        async with catalog_db(redis_db_url, catalog) as url:
            env = worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8", webhook_retry_schedule="1s,1s")
            deliveries = [build_deliveries(signal(agent, 1), [server.url + "/hook"])[0]
                          for agent, server in (("a-huge-200", fine), ("a-huge-503", busy))]
            worker = WorkerProcess(env).start(tmp_path)
            try:
                worker.wait_ready()
                await publish(env, kafka_bootstrap, deliveries)
                failed = await read_topic(kafka_bootstrap, env["SGW_WEBHOOKS_DLQ_TOPIC"], until=lambda v: len(v) >= 1,
                                          timeout_s=60, settle_s=1)
                await wait_for(lambda: worker.metric("sgw_webhook_deliveries_total", outcome="delivered") >= 1,
                               what="the 200 counted delivered")
                await asyncio.sleep(2)  # a resend would come by now: the schedule is 1 s
            finally:
                assert worker.stop() == 0, worker.logs()
        assert len(fine.requests) == 1, "delivered once, never sent again"
        assert len(busy.requests) == 3
    (dead,) = failed
    assert dead["delivery"]["agentId"] == "a-huge-503" and dead["reason"] == "delivery_failed"
    assert [(a["outcome"], a["status"]) for a in dead["attempts"]] == [("failed", 503)] * 3
    assert len(json.dumps(dead)) < 100_000, "what the receiver said is cut in the record"


# --- A worker killed mid-schedule -----------------------------------------------------------------------

async def committed_offsets(kafka_bootstrap: str, group: str) -> int:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        return sum(max(0, meta.offset) for meta in offsets.values())
    finally:
        await admin.close()


async def test_a_worker_killed_mid_schedule_leaves_the_retry_to_the_next_one_and_it_arrives_once(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    with ScriptedServer(default=Reply(body={"ok": True})) as receiver:
        receiver.script(Reply(status=503, body={"error": "deploying"}))
        async with catalog_db(redis_db_url, {"channels": [channel("a-k", receiver, secret=SECRET)]}) as url:
            env = worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8", webhook_retry_schedule="4s")
            delivery = build_deliveries(signal("a-k", 1), [receiver.url + "/hook"])[0]
            first = WorkerProcess(env, name="first").start(tmp_path)
            second = WorkerProcess(env, name="second")
            try:
                first.wait_ready()
                await publish(env, kafka_bootstrap, [delivery])
                await wait_for(lambda: len(receiver.requests) == 1, what="the first attempt")
                # The record's offset is committed: the retry lives in Redis only.
                deadline = time.monotonic() + 5
                while await committed_offsets(kafka_bootstrap, f"workers-{unique}-webhooks") < 1:
                    assert time.monotonic() < deadline, "the offset was not committed once scheduled"
                    await asyncio.sleep(0.2)
                assert first.proc is not None
                first.proc.kill()  # SIGKILL: no goodbye
                first.proc.wait()
                second.start(tmp_path)
                second.wait_ready()
                await wait_for(lambda: len(receiver.requests) == 2, what=f"the retry\n{second.logs()}")
                await asyncio.sleep(2)  # nothing more arrives
            finally:
                assert second.proc is None or second.stop() == 0, second.logs()

    assert len(receiver.requests) == 2
    assert {r.headers["webhook-id"] for r in receiver.requests} == {delivery.id}, "a receiver dedupes on one id"
    for r in receiver.requests:
        Webhook(SECRET).verify(r.body, r.headers)


# --- One bad channel never holds up another -----------------------------------------------------------

async def test_a_dead_and_a_slow_channel_do_not_delay_a_healthy_one(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    from consumers.webhook_lanes import channel_label
    from devtools.processes import free_port
    from scoring.models import AlertChannel

    signals = 8
    dead_url = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens: refused at once
    with ScriptedServer(default=Reply(body={"ok": True})) as healthy, \
            ScriptedServer(default=Reply(body={"ok": True}, delay_s=10)) as slow:
        catalog = {"channels": [channel("a-iso", healthy), channel("a-iso", slow),
                                {"agentId": "a-iso", "url": dead_url}]}
        async with catalog_db(redis_db_url, catalog) as url:
            env = worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8", webhook_timeout_s=15,
                             webhook_retry_schedule=",".join(["1s"] * 10), webhook_breaker_failures=3,
                             webhook_breaker_open_s=1, webhook_disable_after_s=3)
            worker = WorkerProcess(env).start(tmp_path)
            store = CatalogStore(connect(url))
            try:
                worker.wait_ready()
                deliveries = [d for n in range(signals)
                              for d in build_deliveries(signal("a-iso", n), [healthy.url + "/hook", slow.url + "/hook",
                                                                              dead_url])]
                await publish(env, kafka_bootstrap, deliveries)
                published = time.time()
                await wait_for(lambda: len(healthy.requests) == signals, what="the healthy channel")
                slow_started = min(r.at for r in slow.requests)
                await wait_for(lambda: len(slow.requests) >= 4, what="the slow channel")

                async def dead_disabled() -> AlertChannel:
                    deadline = time.monotonic() + 30
                    while True:
                        dead = next(c for c in (await store.snapshot()).channels_for("a-iso") if c.url == dead_url)
                        if dead.disabled or time.monotonic() > deadline:
                            return dead
                        await asyncio.sleep(0.2)

                dead = await dead_disabled()
                breaker = worker.metric("sgw_webhook_breaker_state", channel=channel_label(dead))
                deadline = time.monotonic() + 10
                while worker.metric("sgw_webhook_retries_pending") == 0 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                pending = worker.metric("sgw_webhook_retries_pending")
                oldest = worker.metric("sgw_webhook_oldest_pending_seconds")
                failed = worker.metric("sgw_webhook_deliveries_total", channel=channel_label(dead), outcome="failed")
            finally:
                await store.redis.aclose()
                assert worker.stop() == 0, worker.logs()

    latest_healthy = max(r.at for r in healthy.requests)
    print(f"healthy channel: last of {signals} deliveries {latest_healthy - published:.3f}s after publishing")
    assert latest_healthy < slow_started + 10, "every healthy delivery arrived before the slow channel answered once"
    assert len({r.headers["webhook-id"] for r in healthy.requests}) == len(healthy.requests) == signals, \
        "each healthy delivery arrived once, at its first attempt"
    assert len(slow.requests) <= 4 + 8, "the slow channel got only its own lane's share"
    assert dead.disabled and "failing without a success" in (dead.disabled_reason or ""), "a dead channel is disabled"
    assert breaker == 2, "its breaker is open"
    assert failed >= 3 and pending >= 1 and oldest > 0


# --- Slack and PagerDuty channels ---------------------------------------------------------------------

async def test_pagerduty_triggers_then_resolves_when_the_group_recovers_and_slack_gets_a_message(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    from tests.support.webhook_shapes import ROUTING_KEY, check_pagerduty_event, check_slack_message

    def trace(n: int, output: str) -> tuple[bytes, bytes]:
        return f"t-{n}".encode(), orjson.dumps({
            "traceId": f"t-{n}", "projectId": "p-f", "agentId": "a-f", "timestamp": "2026-12-02T13:00:00Z",
            "spans": [{"spanId": "r", "input": "who?", "output": output}]})

    with ScriptedServer(default=Reply(status=202, body={"status": "success"})) as pd, \
            ScriptedServer(default=Reply(body=b"ok")) as slack:
        catalog = {
            "patterns": [{"id": "email", "name": "Email", "polarity": "failure", "template": "email"}],
            "groups": [{"id": "pii", "name": "PII", "projectId": "p-f",
                        "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"},
                        "members": [{"kind": "pattern", "refId": "email", "weight": 1, "gate": True}]}],
            "channels": [channel("a-f", pd, format="pagerduty", routingKey=ROUTING_KEY),
                         channel("a-f", slack, format="slack")]}
        async with catalog_db(redis_db_url, catalog) as url:
            env = worker_env(kafka_bootstrap, url, unique, egress_allow="127.0.0.0/8")
            worker = WorkerProcess(env).start(tmp_path)
            try:
                worker.wait_ready()
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(1, "mail jane@example.com")])
                await wait_for(lambda: len(pd.requests) == 1 and len(slack.requests) == 1, what="the trigger")
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(2, "all good")])
                await wait_for(lambda: len(pd.requests) == 2, what="the resolve")
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [trace(3, "still good")])
                await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 3)
                await asyncio.sleep(2)  # a recovery with no open incident is not sent
            finally:
                assert worker.stop() == 0, worker.logs()

    trigger, resolve = (r.json() for r in pd.requests)
    assert len(pd.requests) == 2 and len(slack.requests) == 1
    for event in (trigger, resolve):
        check_pagerduty_event(event)
    assert trigger["event_action"] == "trigger" and trigger["payload"]["severity"] == "error"
    assert resolve == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": "scorer-group:pii"}
    assert trigger["dedup_key"] == "scorer-group:pii"
    message = slack.requests[0].json()
    check_slack_message(message)
    assert "PII scored 0.0/10, below 6" in message["text"]
