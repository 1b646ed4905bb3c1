"""The documents the worker publishes - a Rating for every group result, a Signal when one needs
a person, a WebhookDelivery per Signal and alert channel - as their wire contracts (camelCase).
The server builds them (``scoring.results``) and the API answers with them (a group's recent
results); the SDK parses them. Single source of truth: these models.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from scorer_groups.models import MemberKind, Severity

ResultScope = Literal["trace", "session", "span", "dataset", "playground"]
# Where a rating of traffic comes from: live scoring, or a backfill over past traffic. Dataset rows
# and playground examples are not traffic: null.
RatingOrigin = Literal["live", "backfill"]
TRAFFIC_SCOPES = ("trace", "session", "span")
# "skipped": a judge member of a gates-first group not called, a cheap gate having decided.
MemberStatus = Literal["scored", "failed", "not_scored", "skipped"]


class Document(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


class Usage(Document):
    """A judge call's tokens, as its API reported them, and their cost in the operators'
    currency (``SGW_CURRENCY``): null when unknown (a model without a price), never 0 for it."""

    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None = None


class MemberVerdict(Document):
    kind: MemberKind
    ref_id: str
    name: str
    weight: float
    gate: bool
    status: MemberStatus
    native: float | bool | None
    goodness: float | None
    detail: str | None  # a verdict's justification, or why there is none (an error, a skip)
    # A judge's tokens; the key is absent when its API reported none (and for other kinds).
    usage: Usage | None = Field(None, exclude_if=lambda usage: usage is None)
    # A judge's verdict paid for already (the verdict cache): by the judge call of ``cached_from``,
    # a rating id. Both keys are absent for a verdict this rating paid for (and other kinds).
    cached: bool = Field(False, exclude_if=lambda cached: not cached)
    cached_from: str | None = Field(None, exclude_if=lambda v: v is None)


class _AboutGroupResult(Document):
    """What a rating and a signal both say about the result they come from."""

    id: str
    group_id: str
    group_name: str
    project_id: str
    agent_id: str
    scope: ResultScope
    trace_id: str | None = None
    session_id: str | None = None
    # Span scope: the step of the trace that was graded.
    span_id: str | None = None
    span_name: str | None = None


class Rating(_AboutGroupResult):
    kind: str
    turns: int | None = None
    run_id: str | None = None  # dataset scope: the graded run, and the row within it
    row: int | None = None
    origin: RatingOrigin | None = None
    rating: float | None
    reason: str | None
    justification: str
    members: list[MemberVerdict]
    scored_at: datetime


SignalReason = Literal["below_threshold", "no_score", "window_below", "coverage", "drift", "agreement"]
IncidentReason = Literal["window_below", "coverage", "drift", "agreement"]
IncidentState = Literal["opened", "resolved"]


class Signal(_AboutGroupResult):
    """A group result that needs a person: its score below the alert threshold, or - at most
    once per group and interval - no score at all (``reason`` "no_score": a must-pass member
    could not score; ``justification`` names it and why). Or an incident of the group's level
    opening or resolving (``reason`` window_below, coverage, drift or agreement, with ``state`` and
    ``incidentId``; ``rating`` is the window's mean, and no one result is named)."""

    key: str
    reason: SignalReason = "below_threshold"
    rating: float | None
    alert_threshold: float | None
    severity: Severity
    justification: str
    rating_id: str | None  # the result's; none for an incident
    raised_at: datetime
    state: IncidentState | None = None  # an incident's: opened or resolved
    incident_id: str | None = None
    digest_count: int | None = None  # a digest's: the results below the threshold in its period (this one the worst)


DeliveryEvent = Literal["scorer_group.signal", "scorer_group.recovered", "scorer_group.incident.opened",
                        "scorer_group.incident.resolved", "scorer_group.digest"]
DIGEST_EVENT: DeliveryEvent = "scorer_group.digest"  # a period's Signals of a group, in one message
SIGNAL_EVENT: DeliveryEvent = "scorer_group.signal"
RECOVERED_EVENT: DeliveryEvent = "scorer_group.recovered"  # the group is at or over its threshold again
INCIDENT_EVENTS: dict[IncidentState, DeliveryEvent] = {"opened": "scorer_group.incident.opened",
                                                       "resolved": "scorer_group.incident.resolved"}


class WebhookDelivery(Document):
    """One Signal to one alert channel. Neither the channel's secret nor its real URL is here:
    the webhook sender looks the channel up in the catalog by ``channel`` (``url`` is the URL
    masked, for people), so no credential travels on a topic. A ``recovered`` delivery
    (PagerDuty channels: resolve the incident) carries the recovering result in ``signal``."""

    id: str
    signal_id: str
    agent_id: str
    url: str  # masked: credentials and secret query parameters cut
    channel: str = ""  # channel_key(the real URL); empty on deliveries written before it existed
    event: DeliveryEvent = SIGNAL_EVENT
    signal: Signal
    created_at: datetime
