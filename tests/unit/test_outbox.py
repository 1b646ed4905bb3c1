"""Alert routing without a broker: what a scored result publishes is decided by one
pure function, ``scoring.outbox.outbox`` - its rating, its Signal and which channels hear it -
for each alert mode, digests, PagerDuty recoveries, disabled channels, agents and projects,
no-score Signals and a backfill's policy."""

from __future__ import annotations

from typing import Any

import orjson

from scoring.blend import MemberOutcome, blend
from scoring.catalog import CatalogSnapshot
from scoring.models import AlertChannel, ScorerGroup
from scoring.outbox import BACKFILL, BACKFILL_ALERTING, LIVE, Outbox, PublishPolicy, TopicNames, outbox
from scoring.panel import GroupResult
from scoring.results import encode_rating, no_score_signal_id
from scoring.subjects import Trace, session_subject, trace_subject

TOPICS = TopicNames(traces="traces", ratings="ratings", signals="signals", webhooks="webhooks", dlq="dlq")
HOOK, OTHER, SHARED = "https://hooks.example/p1", "https://hooks.example/p2", "https://hooks.example/ops"
PAGER = "https://events.pagerduty.com/v2/enqueue"


def group(mode: str = "each", **online: Any) -> ScorerGroup:
    return ScorerGroup.model_validate({
        "id": "g", "name": "Support bar", "projectId": "p1", "members": [{"kind": "pattern", "refId": "x", "weight": 1}],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high", "alertMode": mode,
                   **online}})


def channel(url: str, project: str | None = "p1", agent: str = "bot", **more: Any) -> AlertChannel:
    return AlertChannel.model_validate({"agentId": agent, "url": url, "projectId": project, **more})


CHANNELS = {
    "mine": channel(HOOK),
    "shared": channel(SHARED, project=None),  # an operator's: hears every project's agent "bot"
    "theirs": channel(OTHER, project="p2"),  # another project's agent also called "bot"
    "elsewhere": channel(HOOK + "/other-agent", agent="other-bot"),
    "off": channel(HOOK + "/off", disabled=True),
    "digest": channel(HOOK + "/digest", digestSeconds=300),
    "pager": channel(PAGER, format="pagerduty", routingKey="r" * 32),
}


def published(g: ScorerGroup, goodness: float | None, *, scope: str = "trace") -> tuple[Any, ...]:
    trace = Trace.model_validate({"traceId": "t-1", "projectId": "p1", "agentId": "bot", "sessionId": "s-1",
                                  "timestamp": "2026-12-06T10:00:00Z", "spans": [{"spanId": "r", "output": "x"}]})
    subject = session_subject([trace, trace]) if scope == "session" else trace_subject(trace)
    native = goodness is not None
    outcome = MemberOutcome(name="X", kind="pattern", weight=1, gate=False, ref_id="x", native=native,
                            goodness=goodness, error=None if native else "timed out")
    result = GroupResult(g, subject, blend([outcome]))
    return g, subject, encode_rating(result, scope, origin="live")  # type: ignore[arg-type]


def route(g: ScorerGroup, goodness: float | None, policy: PublishPolicy = LIVE, scope: str = "trace",
          no_score: bool = False, channels: dict[str, AlertChannel] = CHANNELS) -> Outbox:
    item = published(g, goodness, scope=scope)
    due = {no_score_signal_id(item[2])} if no_score else set()
    return outbox([item], scope, CatalogSnapshot(groups={"g": g}, channels=channels), policy, TOPICS, due)  # type: ignore[arg-type]


def shape(box: Outbox) -> list[tuple[str, str | None, str]]:
    """(topic, key, what): the rating, the Signal's reason, each delivery's channel URL and event."""
    out = []
    for r in box.records:
        doc = orjson.loads(r.value)
        what = (doc["origin"] if r.topic == "ratings" else doc["reason"] if r.topic == "signals"
                else f"{doc['url']} {doc['event']}")
        out.append((r.topic, None if r.key is None else r.key.decode(), what))
    return out


def test_below_the_threshold_each_channel_of_the_agent_in_the_project_hears_it_once() -> None:
    box = route(group(), 0.2)
    assert shape(box) == [("ratings", "t-1", "live"), ("signals", "scorer-group:g", "below_threshold"),
                          ("webhooks", "bot", f"{HOOK} scorer_group.signal"),
                          ("webhooks", "bot", f"{PAGER} scorer_group.signal"),
                          ("webhooks", "bot", f"{SHARED} scorer_group.signal")]  # the project's, then shared
    (signal,) = box.signals
    assert (signal.rating, signal.alert_threshold, signal.severity) == (2.0, 6, "high")


def test_at_or_over_the_threshold_only_pagerduty_hears_a_recovery() -> None:
    box = route(group(), 0.9)
    assert shape(box) == [("ratings", "t-1", "live"), ("webhooks", "bot", f"{PAGER} scorer_group.recovered")]
    assert box.signals == []


def test_a_group_paging_by_incidents_keeps_its_signals_as_the_record_and_delivers_none() -> None:
    for mode in ("window", "drift"):
        low, high = route(group(mode), 0.2), route(group(mode), 0.9)
        assert shape(low) == [("ratings", "t-1", "live"), ("signals", "scorer-group:g", "below_threshold")], mode
        assert shape(high) == [("ratings", "t-1", "live")], mode


def test_no_score_raises_a_signal_only_when_the_rate_limit_says_one_is_due() -> None:
    alerting = group(alertOnNoScore=True)
    assert shape(route(alerting, None)) == [("ratings", "t-1", "live")]
    due = route(alerting, None, no_score=True)
    assert shape(due)[1] == ("signals", "scorer-group:g", "no_score")
    assert due.signals[0].rating is None and len(due.records) == 5  # rating, Signal, three channels


def test_a_backfill_pages_nobody_unless_its_job_asked() -> None:
    assert shape(route(group(), 0.2, BACKFILL)) == [("ratings", "t-1", "live")]  # (the document's origin: its own)
    assert [t for t, _, _ in shape(route(group(), 0.2, BACKFILL_ALERTING))] == ["ratings", "signals", "webhooks",
                                                                                "webhooks", "webhooks"]


def test_a_session_result_is_keyed_by_its_session() -> None:
    assert shape(route(group(), 0.2, scope="session"))[0] == ("ratings", "s-1", "live")


def test_without_a_channel_of_its_agent_a_signal_is_only_the_record() -> None:
    box = route(group(), 0.2, channels={"theirs": CHANNELS["theirs"], "off": CHANNELS["off"],
                                        "digest": CHANNELS["digest"]})
    assert shape(box) == [("ratings", "t-1", "live"), ("signals", "scorer-group:g", "below_threshold")]


def test_a_shadow_publishes_its_rating_and_nothing_else() -> None:
    """A candidate judge's shadow of a group is there to be compared: below the
    threshold, without a score, it raises no Signal and pages no channel."""
    shadow = group(shadowOf="g-live", shadowUntil="2026-12-07T00:00:00Z")
    assert shape(route(shadow, 0.2)) == [("ratings", "t-1", "live")]
    assert shape(route(shadow, None, no_score=True)) == [("ratings", "t-1", "live")]
    assert route(shadow, 0.2).signals == []
