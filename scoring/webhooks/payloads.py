"""What a delivery's body looks like, per channel ``format``: ``standard``, ``slack`` or ``pagerduty``.

The one rule: the body is built when the delivery is attempted, from the delivery on the topic and the
channel in the catalog, so a channel's routing key never travels on a topic. The formats:
docs/design-notes.md.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

import orjson

from scoring.models import AlertChannel
from scoring.results import RECOVERED_EVENT, Signal, WebhookDelivery

PAGERDUTY_SEVERITY = {"low": "info", "medium": "warning", "high": "error", "critical": "critical"}
SLACK_HEADER_MAX = 150  # Slack's limits on a header block and a section's text
SLACK_TEXT_MAX = 3000
PAGERDUTY_SUMMARY_MAX = 1024


class LinkTemplate:
    """``SGW_WEBHOOK_LINK_TEMPLATE``: a URL with ``{field}`` placeholders from the Signal's wire
    fields, e.g. ``https://app.example.com/groups/{groupId}/ratings/{ratingId}``."""

    FIELDS = frozenset(Signal.model_json_schema(by_alias=True)["properties"])

    def __init__(self, template: str) -> None:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        unknown = sorted(names - self.FIELDS)
        if unknown:
            raise ValueError(f"unknown placeholder {{{unknown[0]}}}; use any of "
                             + ", ".join(f"{{{f}}}" for f in sorted(self.FIELDS)))
        self._template = template

    def render(self, signal: Signal) -> str | None:
        if not self._template:
            return None
        wire: Mapping[str, Any] = signal.model_dump(mode="json", by_alias=True)
        return self._template.format_map({k: "" if v is None else v for k, v in wire.items()})


def _threshold(signal: Signal) -> str:
    return "none" if signal.alert_threshold is None else f"{signal.alert_threshold:g}"


INCIDENT_WORDS = {"window_below": "its window's mean is below its threshold",
                  "coverage": "too many results have no score", "drift": "it dropped from its usual level"}


def _headline(signal: Signal, recovered: bool) -> str:
    if signal.state is not None:  # an incident of the group's level, opening or resolving
        if signal.state == "resolved":
            return f"{signal.group_name}: incident resolved ({signal.reason}, {signal.severity})"
        return (f"{signal.group_name}: incident opened - {INCIDENT_WORDS.get(signal.reason, signal.reason)} "
                f"({signal.severity})")
    if signal.digest_count is not None:  # a digest: a period's results below the threshold
        return (f"{signal.group_name}: {signal.digest_count} result{'s' if signal.digest_count > 1 else ''} below "
                f"{_threshold(signal)}, the worst {signal.rating:.1f}/10 (agent {signal.agent_id}, {signal.severity})")
    if signal.rating is None:  # reason no_score: a must-pass member could not score
        return (f"{signal.group_name} has no score: a must-pass member could not score "
                f"(agent {signal.agent_id}, {signal.severity})")
    if recovered:
        return (f"{signal.group_name} recovered: {signal.rating:.1f}/10, at or above "
                f"{_threshold(signal)} (agent {signal.agent_id})")
    return (f"{signal.group_name} scored {signal.rating:.1f}/10, below {_threshold(signal)} "
            f"(agent {signal.agent_id}, {signal.severity})")


def standard(delivery: WebhookDelivery, link: str | None) -> dict[str, Any]:
    data = delivery.signal.model_dump(mode="json", by_alias=True)
    return {"type": delivery.event, "timestamp": data["raisedAt"], "data": {**data, "link": link}}


def _escaped(text: str) -> str:
    """Slack's mrkdwn escaping: tenant text cannot become a mention (<!channel>) or a link."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack(delivery: WebhookDelivery, link: str | None) -> dict[str, Any]:
    s = delivery.signal
    recovered = delivery.event == RECOVERED_EVENT
    headline = _headline(s, recovered)
    subject = f"trace `{_escaped(s.trace_id or '')}`" if s.trace_id else f"session `{_escaped(s.session_id or '')}`"
    if s.incident_id:  # an incident: the group's window, no one result
        subject = f"incident `{s.incident_id}` ({s.reason}, {s.state})"
    if s.span_id:  # span scope: the step of the trace
        subject += f" step `{_escaped(s.span_name or '')}` ({_escaped(s.span_id)})"
    fields = [f"*Group*\n{_escaped(s.group_name)}",
              f"*Score*\n{'no score' if s.rating is None else f'{s.rating:.1f} / 10'} (threshold {_threshold(s)})",
              f"*Severity*\n{s.severity}", f"*Agent*\n{_escaped(s.agent_id)}"]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": headline[:SLACK_HEADER_MAX]}},
        {"type": "section", "text": {"type": "mrkdwn", "text": _escaped(s.justification)[:SLACK_TEXT_MAX]},
         "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
        {"type": "context",
         "elements": [{"type": "mrkdwn", "text": f"{s.key} · {subject} · {s.raised_at.isoformat()}"}]},
    ]
    if link:
        blocks.append({"type": "actions", "elements": [
            {"type": "button", "text": {"type": "plain_text", "text": "Open ratings"}, "url": link}]})
    return {"text": headline, "blocks": blocks}


def pagerduty(delivery: WebhookDelivery, routing_key: str, link: str | None) -> dict[str, Any]:
    s = delivery.signal
    # An incident triggers and resolves under its own key; a result's Signal, under the group's.
    dedup_key = f"incident:{s.incident_id}" if s.incident_id else s.key
    if delivery.event == RECOVERED_EVENT or s.state == "resolved":
        return {"routing_key": routing_key, "event_action": "resolve", "dedup_key": dedup_key}
    event: dict[str, Any] = {
        "routing_key": routing_key, "event_action": "trigger", "dedup_key": dedup_key,
        "payload": {
            "summary": _headline(s, False)[:PAGERDUTY_SUMMARY_MAX], "source": s.agent_id,
            "severity": PAGERDUTY_SEVERITY[s.severity], "timestamp": s.raised_at.isoformat(),
            "component": s.group_name, "group": s.project_id, "class": delivery.event,
            "custom_details": {"reason": s.reason, "rating": s.rating, "alertThreshold": s.alert_threshold,
                               "incidentId": s.incident_id,
                               "groupId": s.group_id,
                               "ratingId": s.rating_id, "traceId": s.trace_id, "sessionId": s.session_id,
                               "spanId": s.span_id, "spanName": s.span_name,
                               "justification": s.justification},
        },
        "client": "scorer-group-worker",
    }
    if link:
        event["links"] = [{"href": link, "text": "Group ratings"}]
        event["client_url"] = link
    return event


def body(channel: AlertChannel, delivery: WebhookDelivery, links: LinkTemplate) -> bytes:
    """The exact bytes POSTed (and signed) for ``delivery`` to ``channel``."""
    link = links.render(delivery.signal)
    if channel.format == "slack":
        return orjson.dumps(slack(delivery, link))
    if channel.format == "pagerduty":
        key = channel.routing_key.get_secret_value() if channel.routing_key is not None else ""
        return orjson.dumps(pagerduty(delivery, key, link))
    return orjson.dumps(standard(delivery, link))
