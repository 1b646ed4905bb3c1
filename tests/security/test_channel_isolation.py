"""Alert channels of different projects never share a lane, a breaker or a disabling,
against the real worker (``scorer-worker run``), broker, Redis and a real receiver.

Agent ids are the tenants' own, so an attacker (project A) can declare a channel with the
victim's (project B) agent id and URL. Before the fix the sender keyed lanes and breakers by
agent and URL only: A's failing deliveries opened B's breaker; and a 410 disabled the channel
``agent|url`` - an operator's shared channel, never A's own (stored as ``project|agent|url``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from standardwebhooks import Webhook

from adapters.stores.catalog import CatalogStore
from consumers.webhook_lanes import channel_label
from scoring.models import AlertChannel
from scoring.results import Signal, WebhookDelivery, build_deliveries
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.http_fakes import Received, Reply, ScriptedServer
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

AGENT = "bot-b"  # the victim's agent id, declared by the attacker too
A_SECRET = "whsec_YXR0YWNrZXItcHJvamVjdC1hLWNoYW5uZWwtc2VjcmV0"
B_SECRET = "whsec_dmljdGltLXByb2plY3QtYi1jaGFubmVsLXNlY3JldDE="
OPERATOR_SECRET = "whsec_b3BlcmF0b3Itc2hhcmVkLWNoYW5uZWwtc2VjcmV0MTI="


def delivery(project: str, n: int, url: str) -> WebhookDelivery:
    """A delivery of project ``project``'s n-th Signal about AGENT (as the trace loop makes one)."""
    signal = Signal(id=f"sig-{project}-{n}", key=f"scorer-group:g-{project}", group_id=f"g-{project}",
                    group_name="G", project_id=project, agent_id=AGENT, scope="trace", trace_id=f"t-{n}",
                    rating=1.0, alert_threshold=6.0, severity="high", justification="below",
                    rating_id=f"r-{project}-{n}", raised_at=datetime.now(UTC))
    return build_deliveries(signal, [url])[0]


async def publish(env: dict[str, str], kafka_bootstrap: str, deliveries: list[WebhookDelivery]) -> None:
    await produce(kafka_bootstrap, env["SGW_WEBHOOKS_TOPIC"], [(d.agent_id.encode(), d.to_json()) for d in deliveries])


async def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def ids(requests: list[Received]) -> list[str]:
    return [r.headers["webhook-id"] for r in requests]


def channel(url: str, secret: str, project: str | None) -> dict[str, object]:
    return {"agentId": AGENT, "url": url, "secret": secret, **({"projectId": project} if project else {})}


async def test_another_projects_failing_channel_to_the_same_agent_and_url_leaves_this_ones_lane_and_breaker(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    # The receiver fails A's first three deliveries (A's breaker opens at 3 failures and stays
    # open for 10 minutes), then answers 200. B's deliveries, published after A's breaker opened
    # and interleaved with more of A's, must go straight through B's own lane and breaker.
    with ScriptedServer(default=Reply(body={"ok": True})) as receiver:
        receiver.script(*[Reply(status=500, body={"error": "not for you"})] * 3)
        url = receiver.url + "/hook"
        catalog = {"channels": [channel(url, A_SECRET, "p-a"), channel(url, B_SECRET, "p-b")]}
        async with catalog_db(redis_db_url, catalog) as db:
            env = worker_env(kafka_bootstrap, db, unique, egress_allow="127.0.0.0/8", webhook_retry_schedule="1s,1s,1s",
                             webhook_breaker_failures=3, webhook_breaker_open_s=600)
            first = [delivery("p-a", n, url) for n in range(3)]
            later_a = [delivery("p-a", n, url) for n in range(3, 6)]
            b = [delivery("p-b", n, url) for n in range(3)]
            worker = WorkerProcess(env).start(tmp_path)
            try:
                worker.wait_ready()
                await publish(env, kafka_bootstrap, first)
                await wait_for(lambda: len(receiver.requests) == 3, "A's three failing attempts")
                await publish(env, kafka_bootstrap, [d for pair in zip(later_a, b, strict=True) for d in pair])
                await wait_for(lambda: {d.id for d in b} <= set(ids(receiver.requests)),
                               f"B's deliveries (a breaker shared with A holds them for 10 minutes)\n{worker.logs()}")
                await asyncio.sleep(2)  # A's retries (1 s) come due: A's open breaker holds them back
                snapshot = (await CatalogStore(connect(db)).snapshot()).channels_for(AGENT)
                a_channel, b_channel = (next(c for c in snapshot if c.project_id == p) for p in ("p-a", "p-b"))
                breakers = {p: worker.metric("sgw_webhook_breaker_state", channel=channel_label(c))
                            for p, c in (("p-a", a_channel), ("p-b", b_channel))}
            finally:
                assert worker.stop() == 0, worker.logs()

    assert sorted(ids(receiver.requests)[:3]) == sorted(d.id for d in first), "A's deliveries failed first"
    assert sorted(ids(receiver.requests)[3:]) == sorted(d.id for d in b), \
        "then only B's, each once at its first attempt; A's lane stays open, not B's"
    for request in receiver.requests[3:]:
        Webhook(B_SECRET).verify(request.body, request.headers)  # sent as B's channel, with B's secret
    assert channel_label(a_channel) != channel_label(b_channel)
    assert breakers == {"p-a": 2, "p-b": 0}, "A's breaker open, B's closed"
    assert not a_channel.disabled and not b_channel.disabled


async def test_a_410_disables_only_the_channel_that_received_it(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    # Three channels to one agent and URL: A's, B's and an operator's shared one. The receiver
    # answers A's delivery 410 Gone, then 200 to everything.
    with ScriptedServer(default=Reply(body={"ok": True})) as receiver:
        receiver.script(Reply(status=410, body={"error": "gone"}))
        url = receiver.url + "/hook"
        catalog = {"channels": [channel(url, A_SECRET, "p-a"), channel(url, B_SECRET, "p-b"),
                                channel(url, OPERATOR_SECRET, None)]}
        async with catalog_db(redis_db_url, catalog) as db:
            env = worker_env(kafka_bootstrap, db, unique, egress_allow="127.0.0.0/8")
            gone, b_after, a_after = delivery("p-a", 1, url), delivery("p-b", 1, url), delivery("p-a", 2, url)
            worker = WorkerProcess(env).start(tmp_path)
            store = CatalogStore(connect(db))
            try:
                worker.wait_ready()
                await publish(env, kafka_bootstrap, [gone])
                # The dead letter is written after the disabling: once it is there, the catalog says.
                failed = await read_topic(kafka_bootstrap, env["SGW_WEBHOOKS_DLQ_TOPIC"], until=lambda v: len(v) >= 1,
                                          timeout_s=60)
                channels = {c.project_id: c for c in (await store.snapshot()).channels_for(AGENT)}
                await asyncio.sleep(1.5)  # the worker's catalog follows the mark (notice, or its 0.5 s poll)
                # Afterwards B's channel still hears B's Signals, and the operator's A's.
                await publish(env, kafka_bootstrap, [b_after, a_after])
                await wait_for(lambda: len(receiver.requests) == 3, f"the later deliveries\n{worker.logs()}")
            finally:
                await store.redis.aclose()
                assert worker.stop() == 0, worker.logs()

    assert [f["reason"] for f in failed] == ["channel_gone"]
    Webhook(A_SECRET).verify(receiver.requests[0].body, receiver.requests[0].headers)  # A's channel got the 410
    a, b, operator = channels["p-a"], channels["p-b"], channels[None]
    assert a.disabled and "410" in (a.disabled_reason or ""), "the channel that answered 410 is disabled"
    assert not b.disabled, "another project's channel with the same agent and URL is not"
    assert not operator.disabled, "nor the operator's"
    by_id = {r.headers["webhook-id"]: r for r in receiver.requests[1:]}
    assert set(by_id) == {b_after.id, a_after.id}
    Webhook(B_SECRET).verify(by_id[b_after.id].body, by_id[b_after.id].headers)
    Webhook(OPERATOR_SECRET).verify(by_id[a_after.id].body, by_id[a_after.id].headers)


def test_channel_labels_name_the_project() -> None:
    shared = {"agentId": AGENT, "url": "https://hooks.example.com/x"}
    a = AlertChannel.model_validate({**shared, "projectId": "p-a"})
    b = AlertChannel.model_validate({**shared, "projectId": "p-b"})
    operator = AlertChannel.model_validate(shared)
    assert len({channel_label(a), channel_label(b), channel_label(operator)}) == 3
    assert channel_label(a).startswith("p-a/") and channel_label(operator).startswith(f"{AGENT}#")
