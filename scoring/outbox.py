"""What scored results publish, decided in one place: a pure function from the results to the records to send.

Senders only send. ``Record`` is the one shape of "a record to send", whoever sends it. The one rule:
every result has its rating; a shadow's has nothing else, and a backfill that did not ask for alerts
stops there. The records, in order: docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from scorer_groups.review_queues import ReviewQueue
from scoring.catalog import CatalogSnapshot
from scoring.frozen import frozen
from scoring.models import AlertChannel, ScorerGroup
from scoring.results import (
    PublishedRating,
    RatingOrigin,
    ResultScope,
    Signal,
    build_deliveries,
    build_no_score_signal,
    build_recovery_deliveries,
    build_signal,
    no_score_signal_id,
    subject_key_of,
)
from scoring.review_rules import KeptItem, kept_items, queues_taking
from scoring.subjects import Subject


@frozen
class Record:
    """One record to send: its topic, key (None: the producer's choice of partition), value and
    headers."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]] | None = None


@dataclass(frozen=True)
class TopicNames:
    traces: str
    ratings: str
    signals: str
    webhooks: str
    dlq: str


@dataclass(frozen=True)
class PublishPolicy:
    """What a publish says and raises: live scoring's (origin "live", Signals and deliveries), or
    a backfill's (origin "backfill", Signals only when the job asked for them)."""

    origin: RatingOrigin = "live"
    signals: bool = True
    history_at_subject: bool = False  # count a result in the history at its trace's own time
    # The history counts the traffic's budget skips and filter matches now: live traffic's. A
    # backfill's pairs out of budget are graded later (the job pauses), not skipped.
    traffic_counts: bool = True


LIVE = PublishPolicy()
BACKFILL = PublishPolicy(origin="backfill", signals=False, history_at_subject=True, traffic_counts=False)
BACKFILL_ALERTING = PublishPolicy(origin="backfill", signals=True, history_at_subject=True, traffic_counts=False)


@frozen
class Outbox:
    records: list[Record]  # in order: each result's rating, then its Signal and deliveries
    signals: list[Signal]  # the Signals raised (counted by the caller)
    # rating id: the items its result makes, each with the queue that takes it (most make none)
    review_items: dict[str, list[tuple[KeptItem, ReviewQueue]]]


def channels_hearing(group: ScorerGroup, agent_id: str, snapshot: CatalogSnapshot) -> list[AlertChannel]:
    """The channels that hear a result of ``group`` for ``agent_id`` as it is published (step 4)."""
    if group.online is not None and group.online.alert_mode != "each":
        return []
    return [c for c in snapshot.channels_for(agent_id, group.project_id) if not c.disabled and c.digest_seconds is None]


def outbox(results: Sequence[tuple[ScorerGroup, Subject, PublishedRating]], scope: ResultScope,
           snapshot: CatalogSnapshot, policy: PublishPolicy, topics: TopicNames,
           no_score: Collection[str] = ()) -> Outbox:
    """The records ``results`` publish (the steps above); ``no_score``: the ids of the no-score
    Signals due (``no_score_signal_id``)."""
    records: list[Record] = []
    signals: list[Signal] = []
    items: dict[str, list[tuple[KeptItem, ReviewQueue]]] = {}
    for group, subject, rating in results:
        key = subject.session_id if scope == "session" else subject.trace_id
        records.append(Record(topics.ratings, key.encode() if key else None, rating.document))  # 1.
        if group.online is not None and group.online.shadow_of is not None:
            continue  # a shadow (a candidate judge beside its group): its rating alone, for comparison
        watching = snapshot.queues_watching(group.id)  # 6. (most groups: none, one lookup)
        if watching:
            taking = queues_taking(watching, group, policy.origin, subject_key=subject_key_of(subject),
                                   rating=rating.rating, goodness=rating.goodness)
            if taking:
                items[rating.id] = kept_items(taking, policy.origin, subject, rating)
        if not policy.signals:  # 2.
            continue
        signal = build_signal(group, rating)  # 3.
        if signal is None and no_score_signal_id(rating) in no_score:
            signal = build_no_score_signal(group, rating)
        channels = channels_hearing(group, subject.agent_id, snapshot)  # 4.
        if signal is None:  # 5.
            resolving = [c.url for c in channels if c.format == "pagerduty"]
            records += [Record(topics.webhooks, d.agent_id.encode(), d.to_json())
                        for d in build_recovery_deliveries(group, rating, resolving)]
            continue
        signals.append(signal)
        records.append(Record(topics.signals, signal.key.encode(), signal.to_json()))
        records += [Record(topics.webhooks, d.agent_id.encode(), d.to_json())
                    for d in build_deliveries(signal, [c.url for c in channels])]
    return Outbox(records, signals, items)
