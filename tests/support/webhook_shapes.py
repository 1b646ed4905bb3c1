"""What Slack (incoming webhooks, Block Kit limits) and PagerDuty (Events API v2) accept, as
checks on an alert body."""

from __future__ import annotations

from datetime import datetime
from typing import Any

ROUTING_KEY = "R0UT1NGK3Y0123456789abcdefABCDEF"


def check_slack_message(message: dict[str, Any]) -> None:
    """Slack: `text` is the notification fallback; `blocks` at most 50, each of a known type
    within Block Kit's limits."""
    assert set(message) <= {"text", "blocks"} and isinstance(message["text"], str) and message["text"]
    assert len(message["blocks"]) <= 50
    for block in message["blocks"]:
        kind = block["type"]
        if kind == "header":
            assert block["text"]["type"] == "plain_text" and 0 < len(block["text"]["text"]) <= 150
        elif kind == "section":
            assert block["text"]["type"] in ("mrkdwn", "plain_text") and len(block["text"]["text"]) <= 3000
            assert len(block.get("fields", [])) <= 10
            assert all(f["type"] in ("mrkdwn", "plain_text") and len(f["text"]) <= 2000 for f in block["fields"])
        elif kind == "context":
            assert 0 < len(block["elements"]) <= 10
            assert all(e["type"] in ("mrkdwn", "plain_text", "image") for e in block["elements"])
        elif kind == "actions":
            for e in block["elements"]:
                assert e["type"] == "button" and e["text"]["type"] == "plain_text" and len(e["text"]["text"]) <= 75
                assert len(e["url"]) <= 3000
        else:
            raise AssertionError(f"unexpected block type {kind}")


def check_pagerduty_event(event: dict[str, Any]) -> None:
    """PagerDuty Events API v2: routing_key, event_action and (for trigger) a payload with
    summary (<= 1024), source and one of four severities; dedup_key <= 255."""
    assert isinstance(event["routing_key"], str) and event["routing_key"]
    assert event["event_action"] in ("trigger", "acknowledge", "resolve")
    assert 0 < len(event["dedup_key"]) <= 255
    if event["event_action"] == "trigger":
        payload = event["payload"]
        assert 0 < len(payload["summary"]) <= 1024 and payload["source"]
        assert payload["severity"] in ("critical", "error", "warning", "info")
        datetime.fromisoformat(payload["timestamp"])
        assert all(set(link) <= {"href", "text"} for link in event.get("links", []))
    assert set(event) <= {"routing_key", "event_action", "dedup_key", "payload", "images", "links", "client",
                          "client_url"}
