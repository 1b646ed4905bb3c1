"""The demo's local webhook receiver verifies what the worker signs, and refuses what it did not."""

from __future__ import annotations

import time

import httpx
import orjson

from devtools.demo import local_channels
from devtools.webhook_receiver import WebhookReceiver
from scorer_groups import signing

SECRET = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3"
BODY = orjson.dumps({"type": "scorer_group.signal", "timestamp": "2026-12-02T13:00:00Z",
                     "data": {"groupId": "support", "rating": 3.5, "alertThreshold": 6.0}})


def post(receiver: WebhookReceiver, name: str, headers: dict[str, str]) -> int:
    return httpx.post(receiver.channel_url(name), content=BODY, headers=headers, timeout=5).status_code


def test_a_signed_delivery_verifies_and_a_forged_one_is_refused() -> None:
    lines: list[str] = []
    with WebhookReceiver({"bot": SECRET, "plain": None}, say=lines.append) as receiver:
        now = int(time.time())
        assert post(receiver, "bot", signing.headers("d-1", now, BODY, [SECRET])) == 204
        forged = signing.headers("d-2", now, BODY, [signing.new_secret()])
        assert post(receiver, "bot", forged) == 400
        assert post(receiver, "bot", signing.headers("d-3", now - 3600, BODY, [SECRET])) == 400, "stale timestamp"
        assert post(receiver, "plain", signing.headers("d-4", now, BODY, [])) == 204
        assert post(receiver, "nobody", {}) == 404
    assert len(receiver.verified) == 2 and receiver.rejected == ["bot", "bot"]
    assert lines[0].startswith("RECEIVED bot (signature verified) d-1: support rating 3.5 < 6.0")


def test_the_demo_points_every_channel_at_loopback() -> None:
    catalog = {"channels": [{"agentId": "a", "url": "https://hooks.example.com/x", "secret": SECRET},
                            {"agentId": "b", "url": "https://hooks.example.com/y"}]}
    local, receiver = local_channels(catalog)
    receiver.stop()
    assert [c["url"] for c in local["channels"]] == [receiver.channel_url("a"), receiver.channel_url("b")]
    assert all(c["url"].startswith("http://127.0.0.1:") for c in local["channels"])
    assert local["channels"][0]["secret"] == SECRET
