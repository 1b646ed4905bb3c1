"""Building the documents a group result becomes: a Rating (always), a Signal (below the alert
threshold) and one WebhookDelivery per alert channel of the agent. Their models - the design
page's wire contracts - are the SDK's (``scorer_groups.documents``), re-exported here for the
server's code.

Ids are deterministic: the rating id from the (group, subject) pair, the signal id from the
rating id, the delivery id from the signal id and channel. A repeated publish after a crash
carries the same ids, so every consumer downstream can deduplicate on them.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson

from scorer_groups.documents import (
    RECOVERED_EVENT,
    SIGNAL_EVENT,
    TRAFFIC_SCOPES,
    DeliveryEvent,
    MemberVerdict,
    Rating,
    RatingOrigin,
    ResultScope,
    Signal,
    SignalReason,
    Usage,
    WebhookDelivery,
)
from scoring.claim_request import span_key
from scoring.frozen import frozen
from scoring.judge_calls import encode_calls
from scoring.models import ScorerGroup
from scoring.panel import GroupResult
from scoring.prices import nanos
from scoring.redact import mask_url
from scoring.subjects import Subject

__all__ = [
    "RECOVERED_EVENT", "SIGNAL_EVENT", "DeliveryEvent", "HistoryEntry", "MemberVerdict", "PublishedRating", "Rating",
    "RatingOrigin",
    "ResultScope", "Signal", "SignalReason", "Usage", "WebhookDelivery", "build_deliveries", "build_no_score_signal",
    "build_rating", "build_recovery_deliveries", "build_signal", "channel_key", "delivery", "derived_id",
    "encode_rating", "history_entry", "rating_document", "rating_id", "result_signal", "signal_key", "tokens_of",
]

_IDS = uuid.UUID("6f1c5a8e-6a8f-4f7e-9a63-2c1d0b7e4a10")  # namespace of every id we derive
_IDS_BYTES = _IDS.bytes


def signal_key(group_id: str) -> str:
    """What events of a group key on, everywhere: ``scorer-group:<id>``."""
    return f"scorer-group:{group_id}"


def derived_id(name: str) -> str:
    """``str(uuid.uuid5(_IDS, name))``, without building UUID objects (two per output record)."""
    digest = bytearray(hashlib.sha1(_IDS_BYTES + name.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    h = digest.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def rating_id(group_id: str, subject_key: str) -> str:
    return derived_id(f"rating:{group_id}:{subject_key}")


def channel_key(url: str) -> str:
    """Names an alert channel on topics and in dead letters without its URL, which may carry
    credentials: a hash of the URL, looked up in the catalog by the sender."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


def subject_key(result: GroupResult) -> str:
    """The subject part of the dedupe pair: the trace, or the session at a turn count."""
    return subject_key_of(result.subject)


def subject_key_of(s: Subject) -> str:
    if s.scope == "session":
        return f"session:{s.session_id}:{s.turns}"
    if s.scope == "span":
        return span_key(s.trace_id or "", s.span_id or "")
    return f"trace:{s.trace_id}"


def origin_of(scope: ResultScope, origin: RatingOrigin | None = None) -> RatingOrigin | None:
    """A rating's origin: as given, else "live" for traffic (trace, session, span scope) and none
    for dataset rows and playground examples."""
    return origin if origin is not None else ("live" if scope in TRAFFIC_SCOPES else None)


def rating_document(result: GroupResult, scope: ResultScope, now: datetime | None = None,
                    dataset: tuple[str, int] | None = None, origin: RatingOrigin | None = None) -> dict[str, Any]:
    """The one mapping of a result onto its rating document: the wire's names, in the wire's
    order (``Rating``'s), with plain values - what the hot path encodes with orjson as it stands
    (``encode_rating``) and what ``build_rating`` validates into the model. A new field of the
    rating is one line here and one in ``Rating``; a test holds the two byte for byte.
    ``dataset`` is (run id, row index) for a graded dataset row. The blend's values are already
    checked (finite, on their scales)."""
    group, s, b = result.group, result.subject, result.blend
    key = f"dataset:{dataset[0]}:{dataset[1]}" if dataset else subject_key(result)
    members: list[dict[str, Any]] = []
    for m in b.members:
        o = m.outcome
        entry: dict[str, Any] = {
            "kind": o.kind, "refId": o.ref_id, "name": o.name, "weight": float(o.weight), "gate": o.gate,
            "status": m.status,
            "native": o.native if o.native is None or isinstance(o.native, bool) else float(o.native),
            "goodness": None if o.goodness is None else float(o.goodness),
            "detail": o.detail or o.error or o.skipped}
        if o.usage is not None:  # absent, not null, when the judge's API reported none (MemberVerdict)
            entry["usage"] = {"promptTokens": o.usage.prompt_tokens, "completionTokens": o.usage.completion_tokens,
                              "cost": o.usage.cost}
        if o.cached_from is not None:  # absent unless the verdict was paid for already (MemberVerdict)
            entry["cached"] = True
            entry["cachedFrom"] = o.cached_from
        members.append(entry)
    return {
        "id": rating_id(group.id, key), "groupId": group.id, "groupName": group.name, "projectId": group.project_id,
        "agentId": s.agent_id, "scope": scope, "traceId": s.trace_id if s.scope != "session" else None,
        "sessionId": s.session_id, "spanId": s.span_id, "spanName": s.span_name,
        "kind": signal_key(group.id), "turns": s.turns if s.scope == "session" else None,
        "runId": dataset[0] if dataset else None, "row": dataset[1] if dataset else None,
        "origin": origin_of(scope, origin), "rating": None if b.score is None else float(b.score),
        "reason": b.reason, "justification": b.justification, "members": members,
        "scoredAt": now or datetime.now(UTC)}


def build_rating(result: GroupResult, scope: ResultScope, now: datetime | None = None,
                 dataset: tuple[str, int] | None = None, origin: RatingOrigin | None = None) -> Rating:
    """The rating of a result as the validated model (dataset rows, tests); ``dataset`` is (run
    id, row index) for a graded dataset row."""
    return Rating.model_validate(rating_document(result, scope, now, dataset, origin))


class PublishedRating:
    """A rating encoded for publishing: ``document`` is its JSON, exactly as the validated
    ``Rating`` would serialize; the attributes are what the pipeline reads back of it (Signals,
    the history, session verdicts), read from the one mapping (``rating_document``)."""

    __slots__ = ("_fields", "document")

    def __init__(self, fields: dict[str, Any], document: bytes) -> None:
        self._fields, self.document = fields, document

    @property
    def id(self) -> str:
        return self._fields["id"]  # type: ignore[no-any-return]

    @property
    def group_id(self) -> str:
        return self._fields["groupId"]  # type: ignore[no-any-return]

    @property
    def agent_id(self) -> str | None:
        return self._fields["agentId"]  # type: ignore[no-any-return]

    @property
    def scope(self) -> ResultScope:
        return self._fields["scope"]  # type: ignore[no-any-return]

    @property
    def trace_id(self) -> str | None:
        return self._fields["traceId"]  # type: ignore[no-any-return]

    @property
    def session_id(self) -> str | None:
        return self._fields["sessionId"]  # type: ignore[no-any-return]

    @property
    def span_id(self) -> str | None:
        return self._fields["spanId"]  # type: ignore[no-any-return]

    @property
    def span_name(self) -> str | None:
        return self._fields["spanName"]  # type: ignore[no-any-return]

    @property
    def rating(self) -> float | None:
        return self._fields["rating"]  # type: ignore[no-any-return]

    @property
    def reason(self) -> str | None:
        return self._fields["reason"]  # type: ignore[no-any-return]

    @property
    def justification(self) -> str:
        return self._fields["justification"]  # type: ignore[no-any-return]

    @property
    def scored_at(self) -> datetime:
        return self._fields["scoredAt"]  # type: ignore[no-any-return]

    @property
    def fields(self) -> dict[str, Any]:
        """The document as a dict (the wire's names): read it, never change it."""
        return self._fields

    @property
    def goodness(self) -> list[float | None]:
        """Each member's goodness (0..1), None for one that did not score."""
        return [m["goodness"] for m in self._fields["members"]]


def encode_rating(result: GroupResult, scope: ResultScope, now: datetime | None = None,
                  origin: RatingOrigin | None = None) -> PublishedRating:
    """The rating of a live result, encoded straight from its document with orjson: the hot
    path's ``build_rating(...).to_json()`` without building and validating pydantic models (a
    third of a trace's CPU)."""
    doc = rating_document(result, scope, now, origin=origin)
    try:
        document = orjson.dumps(doc, option=orjson.OPT_UTC_Z)
    except orjson.JSONEncodeError:
        # Text UTF-8 cannot carry (a lone surrogate, e.g. "\\ud800" in a judge's JSON answer): the
        # model cannot encode it either. Replaced, so that the result is published, not lost.
        doc = _scrubbed(doc)
        document = orjson.dumps(doc, option=orjson.OPT_UTC_Z)
    return PublishedRating(doc, document)


# In a str a surrogate is always a lone one (built with chr(): a compiler refuses one in a literal).
_SURROGATES = re.compile(f"[{chr(0xD800)}-{chr(0xDFFF)}]")


def _scrubbed(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8 (lone surrogates become U+FFFD)."""
    if isinstance(value, str):
        return _SURROGATES.sub("\ufffd", value)
    if isinstance(value, dict):
        return {k: _scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrubbed(v) for v in value]
    return value


def below_threshold(group: ScorerGroup, rating: float | None) -> bool:
    """A Signal is due when the group score lands below the threshold. No score raises none."""
    online = group.online
    return (online is not None and online.alert_threshold is not None and rating is not None
            and rating < online.alert_threshold)


def group_signal(group: ScorerGroup, *, id_: str, agent_id: str | None, scope: str, rating: float | None,
                 justification: str, raised_at: datetime, reason: str = "below_threshold", **about: Any) -> Signal:
    """Every Signal of a group, whatever raised it (a result, an incident, a digest): keyed
    ``scorer-group:<id>``, with the group's name, project, threshold and severity; ``about`` is
    what the reason adds (the result's subject, the incident, the digest's count)."""
    assert group.online is not None
    return Signal(id=id_, key=signal_key(group.id), reason=reason, group_id=group.id, group_name=group.name,
                  project_id=group.project_id, agent_id=agent_id, scope=scope, rating=rating,
                  alert_threshold=group.online.alert_threshold, severity=group.online.severity,
                  justification=justification, raised_at=raised_at, **about)


def result_signal(group: ScorerGroup, rating: Rating | PublishedRating, *, id_: str, score: float | None,
                  justification: str, reason: SignalReason = "below_threshold") -> Signal:
    """The Signal of one result of ``group`` - below its threshold, without a score, or back over
    it (a recovery)."""
    return group_signal(group, id_=id_, reason=reason, agent_id=rating.agent_id, scope=rating.scope, rating=score,
                        justification=justification, raised_at=rating.scored_at, trace_id=rating.trace_id,
                        session_id=rating.session_id, span_id=rating.span_id, span_name=rating.span_name,
                        rating_id=rating.id)


def digest_signal(group: ScorerGroup, channel_url: str, agent_id: str, period: int, period_s: int,
                  below: list[dict[str, Any]], complete: bool) -> Signal:
    """A digest channel's Signal of one period: the count of the agent's results below the
    threshold (``below``: their documents; ``complete``: whether that is all of them) and the
    worst of them, which it carries."""
    assert group.online is not None and below
    worst = min(below, key=lambda d: d["rating"])
    count, end = len(below), (period + 1) * period_s
    span = f"{period_s // 60} min" if period_s < 7200 else f"{period_s / 3600:g} h"
    justification = (f"{'' if complete else 'at least '}{count} result{'s' if count > 1 else ''} below "
                     f"{group.online.alert_threshold:g} in {span} (to {datetime.fromtimestamp(end, UTC):%H:%M} "
                     f"UTC); the worst: {worst['rating']:.1f} - {worst.get('justification', '')}")
    return group_signal(group, id_=derived_id(f"digest:{group.id}:{channel_key(channel_url)}:{period}"),
                        agent_id=agent_id, scope=worst["scope"], rating=worst["rating"],
                        justification=justification[:2000], raised_at=datetime.fromtimestamp(end, UTC),
                        trace_id=worst.get("traceId"), session_id=worst.get("sessionId"),
                        span_id=worst.get("spanId"), span_name=worst.get("spanName"), rating_id=worst["id"],
                        digest_count=count)


def build_signal(group: ScorerGroup, rating: Rating | PublishedRating) -> Signal | None:
    if not below_threshold(group, rating.rating):
        return None
    return result_signal(group, rating, id_=derived_id(f"signal:{rating.id}"), score=rating.rating,
                         justification=rating.justification)


def no_score_due(group: ScorerGroup, rating: Rating | PublishedRating) -> bool:
    """A result without a score, of a group that alerts on it: a no-score Signal may be due
    (whether it is, the rate limit decides: ``adapters.stores.alerts``)."""
    online = group.online
    return online is not None and online.alert_on_no_score and rating.rating is None


def no_score_signal_id(rating: Rating | PublishedRating) -> str:
    return derived_id(f"no-score-signal:{rating.id}")


def build_no_score_signal(group: ScorerGroup, rating: Rating | PublishedRating) -> Signal:
    return result_signal(group, rating, id_=no_score_signal_id(rating), score=None, reason="no_score",
                         justification=rating.reason or "No score")


def delivery(signal: Signal, url: str, *, agent_id: str | None = None,
             event: DeliveryEvent = SIGNAL_EVENT) -> WebhookDelivery:
    """One Signal to one channel (found by ``agent_id``, the Signal's by default): the one place a
    delivery is made. Its id is the Signal's and the URL's: a redelivery is the same delivery."""
    return WebhookDelivery(id=derived_id(f"delivery:{signal.id}:{url}"), signal_id=signal.id,
                           agent_id=signal.agent_id if agent_id is None else agent_id, url=mask_url(url),
                           channel=channel_key(url), event=event, signal=signal, created_at=signal.raised_at)


def build_deliveries(signal: Signal, channel_urls: list[str]) -> list[WebhookDelivery]:
    return [delivery(signal, url) for url in channel_urls]


def recovered(group: ScorerGroup, rating: float | None) -> bool:
    """The group scored at or above its alert threshold: what resolves an open incident."""
    online = group.online
    return (online is not None and online.alert_threshold is not None and rating is not None
            and rating >= online.alert_threshold)


def build_recovery_deliveries(group: ScorerGroup, rating: Rating | PublishedRating,
                              channel_urls: list[str]) -> list[WebhookDelivery]:
    """For channels that resolve incidents: the result that brings the group back over its
    threshold, Signal-shaped (same key), as a ``scorer_group.recovered`` delivery."""
    if not channel_urls or not recovered(group, rating.rating):
        return []
    recovery = result_signal(group, rating, id_=derived_id(f"recovery:{rating.id}"), score=rating.rating,
                             justification=rating.justification)
    return [delivery(recovery, url, event=RECOVERED_EVENT) for url in channel_urls]


@frozen
class HistoryEntry:
    """One group result, as the ratings history counts it (``adapters.stores.ratings``)."""

    group_id: str
    rating: float | None
    below_threshold: bool
    at: float  # epoch seconds
    document: bytes = b""  # the rating as published, kept among the group's latest results
    # A result counted at its subject's own time, not now (a backfill's): the history also counts
    # it apart, so the incident watcher judges live traffic only (adapters.stores.incidents).
    past: bool = False
    rating_id: str = ""  # finds the document (and its judge calls) among the latest results
    calls: bytes = b""  # its judge calls, cut and masked (scoring.judge_calls.encode_calls)
    # What its judge calls cost (nanos, scoring.prices) by member ref id - the calls made, not a
    # verdict the cache paid for - and how many calls' cost is unknown (an unpriced model).
    costs: tuple[tuple[str, int], ...] = ()
    unpriced: int = 0
    judge_calls: int = 0  # the calls made, and their tokens: a backfill's estimate averages them
    tokens: int = 0


def tokens_of(result: GroupResult) -> int:
    """The judge tokens a result's members reported (0 for what reported none)."""
    return sum(m.outcome.usage.total for m in result.blend.members if m.outcome.usage is not None)


def member_costs(result: GroupResult) -> tuple[tuple[tuple[str, int], ...], int, int]:
    """What each judge member's calls cost (nanos, by ref id; the calls made), how many calls'
    cost is unknown, and how many calls were made: the history's spend, in one pass."""
    costs: dict[str, int] = {}
    unpriced = made = 0
    for m in result.blend.members:
        for call in m.outcome.calls:  # none for a member that is no judge: most of them
            if call.cached_from is not None:
                continue
            made += 1
            if call.usage is None or call.usage.cost is None:
                unpriced += 1
            else:
                costs[m.outcome.ref_id] = costs.get(m.outcome.ref_id, 0) + nanos(call.usage.cost)
    return tuple(costs.items()), unpriced, made


def cost_of(result: GroupResult) -> int | None:
    """What a result's judge calls cost, in nanos of the currency (``scoring.prices``): the calls
    made (a verdict the cache paid for cost nothing again); None when one's cost is unknown."""
    total = 0
    for m in result.blend.members:
        for call in m.outcome.calls:
            if call.cached_from is not None:
                continue
            if call.usage is None or call.usage.cost is None:
                return None
            total += nanos(call.usage.cost)
    return total


def history_entry(group: ScorerGroup, rating: Rating | PublishedRating, document: bytes = b"",
                  at: float | None = None, result: GroupResult | None = None) -> HistoryEntry:
    """How the ratings history counts a published rating (``document``: its JSON as published),
    in the bucket of when it was scored - or of ``at`` (a backfill: the trace's own time, so the
    chart fills in the past); kept with ``result``'s judge calls."""
    calls = b"" if result is None else encode_calls(
        [(m.outcome.ref_id, m.outcome.name, m.outcome.calls) for m in result.blend.members if m.outcome.calls])
    costs, unpriced, made = member_costs(result) if result is not None else ((), 0, 0)
    return HistoryEntry(group.id, rating.rating, below_threshold(group, rating.rating),
                        rating.scored_at.timestamp() if at is None else at, document, past=at is not None,
                        rating_id=rating.id, calls=calls, costs=costs, unpriced=unpriced, judge_calls=made,
                        tokens=tokens_of(result) if result is not None and made else 0)
