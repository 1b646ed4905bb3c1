"""Alert bodies per channel format, checked against the shapes Slack (incoming webhooks, Block
Kit limits) and PagerDuty (Events API v2) document."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from scoring.models import AlertChannel
from scoring.results import RECOVERED_EVENT, Signal, WebhookDelivery, build_deliveries
from scoring.webhooks.payloads import LinkTemplate, body
from tests.support.webhook_shapes import ROUTING_KEY, check_pagerduty_event, check_slack_message

LINK = LinkTemplate("https://app.example.com/groups/{groupId}/ratings/{ratingId}")


def delivery(severity: str = "high", event: str = "scorer_group.signal") -> WebhookDelivery:
    signal = Signal(id="sig-1", key="scorer-group:support", group_id="support", group_name="Support quality",
                    project_id="shop", agent_id="support-bot", scope="trace", trace_id="t-9", rating=3.5,
                    alert_threshold=6, severity=severity, justification="Weighted blend: " + "x" * 5000,
                    rating_id="r-9", raised_at=datetime(2026, 12, 2, 13, 0, tzinfo=UTC))
    d = build_deliveries(signal, ["https://hooks.example.com/x"])[0]
    return d.model_copy(update={"event": event})


def channel(fmt: str, **extra: Any) -> AlertChannel:
    return AlertChannel.model_validate({"agentId": "support-bot", "url": "https://hooks.example.com/x",
                                        "format": fmt, **extra})


def test_standard_is_the_standard_webhooks_envelope_with_the_signal_and_a_link() -> None:
    sent = orjson.loads(body(channel("standard"), delivery(), LINK))
    assert sent["type"] == "scorer_group.signal" and sent["timestamp"] == "2026-12-02T13:00:00Z"
    assert sent["data"]["key"] == "scorer-group:support" and sent["data"]["rating"] == 3.5
    assert sent["data"]["link"] == "https://app.example.com/groups/support/ratings/r-9"
    assert orjson.loads(body(channel("standard"), delivery(), LinkTemplate("")))["data"]["link"] is None


def test_slack_is_an_incoming_webhook_message_within_block_kit_limits() -> None:
    message = orjson.loads(body(channel("slack"), delivery(), LINK))
    check_slack_message(message)
    assert "Support quality scored 3.5/10, below 6" in message["text"]
    assert message["blocks"][-1]["elements"][0]["url"] == "https://app.example.com/groups/support/ratings/r-9"


def test_tenant_text_cannot_mention_everyone_in_slack() -> None:
    d = delivery()
    d = d.model_copy(update={"signal": d.signal.model_copy(update={"justification": "<!channel> see <http://x|here>"})})
    message = orjson.loads(body(channel("slack"), d, LINK))
    assert "<!channel>" not in orjson.dumps(message).decode() and "&lt;!channel&gt;" in orjson.dumps(message).decode()


@pytest.mark.parametrize(("severity", "expected"), [("low", "info"), ("medium", "warning"), ("high", "error"),
                                                    ("critical", "critical")])
def test_pagerduty_triggers_with_the_signal_key_as_dedup_key(severity: str, expected: str) -> None:
    event = orjson.loads(body(channel("pagerduty", routingKey=ROUTING_KEY), delivery(severity), LINK))
    check_pagerduty_event(event)
    assert event["event_action"] == "trigger" and event["dedup_key"] == "scorer-group:support"
    assert event["routing_key"] == ROUTING_KEY and event["payload"]["severity"] == expected


def test_pagerduty_resolves_the_same_incident_on_recovery() -> None:
    event = orjson.loads(body(channel("pagerduty", routingKey=ROUTING_KEY), delivery(event=RECOVERED_EVENT), LINK))
    check_pagerduty_event(event)
    assert event == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": "scorer-group:support"}


def test_a_pagerduty_channel_needs_its_routing_key_and_it_is_masked() -> None:
    with pytest.raises(ValueError, match="routingKey"):
        channel("pagerduty")
    with pytest.raises(ValueError, match="routingKey"):
        channel("slack", routingKey=ROUTING_KEY)
    assert channel("pagerduty", routingKey=ROUTING_KEY).wire()["routingKey"] == "**********"


def test_a_link_template_with_an_unknown_placeholder_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown placeholder \{group\}"):
        LinkTemplate("https://x/{group}")


def test_a_no_score_signal_says_so_in_every_format() -> None:
    broken = delivery("critical")
    signal = broken.signal.model_copy(update={
        "reason": "no_score", "rating": None,
        "justification": 'No score: must-pass member "Safety" could not score (judge down)'})
    broken = broken.model_copy(update={"signal": signal})
    slack = orjson.loads(body(channel("slack"), broken, LINK))
    check_slack_message(slack)
    assert slack["text"] == "Support quality has no score: a must-pass member could not score (agent support-bot, critical)"
    assert "*Score*\nno score (threshold 6)" in [f["text"] for f in slack["blocks"][1]["fields"]]
    event = orjson.loads(body(channel("pagerduty", routingKey=ROUTING_KEY), broken, LINK))
    assert event["event_action"] == "trigger" and event["dedup_key"] == "scorer-group:support"
    assert event["payload"]["custom_details"]["reason"] == "no_score" and event["payload"]["custom_details"]["rating"] is None
    standard = orjson.loads(body(channel("standard"), broken, LINK))
    assert (standard["data"]["reason"], standard["data"]["rating"]) == ("no_score", None)


def test_a_span_scope_signal_names_its_step_in_every_format() -> None:
    d = delivery()
    step = d.signal.model_copy(update={"scope": "span", "span_id": "tool-7", "span_name": "<!here> lookup"})
    d = d.model_copy(update={"signal": step})
    standard = orjson.loads(body(channel("standard"), d, LINK))["data"]
    assert (standard["scope"], standard["spanId"], standard["spanName"]) == ("span", "tool-7", "<!here> lookup")
    message = orjson.loads(body(channel("slack"), d, LINK))
    check_slack_message(message)
    context = message["blocks"][2]["elements"][0]["text"]
    assert "trace `t-9` step `&lt;!here&gt; lookup` (tool-7)" in context, "the step named, its name escaped"
    event = orjson.loads(body(channel("pagerduty", routingKey=ROUTING_KEY), d, LINK))
    check_pagerduty_event(event)
    assert event["payload"]["custom_details"]["spanId"] == "tool-7"
