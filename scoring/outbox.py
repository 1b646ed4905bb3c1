"""What scored results publish, decided in one place: a pure function from the results (and the
catalog snapshot, the publish policy, the topics) to the records to send. Senders only send.

``Record`` is the one shape of "a record to send" - the trace loop's dead letters, the OTLP
intake's traces, the incident watcher's and the digest sender's Signals, every result's rating -
whoever sends it (``consumers.outputs.Outputs.send``, ``consumers.loop.PartitionLoop.send``).

For each result, in order (``outbox``):

1. its rating, keyed by its trace (or session): every result has one - and a shadow's (a
   candidate judge's copy of a group) has nothing else: it is there to be compared;
2. a backfill that did not ask for alerts stops here: last week's traffic pages nobody;
3. its Signal: below the group's alert threshold, or without a score when a no-score Signal is
   due (the rate limit's word, ``no_score``); keyed ``scorer-group:<id>``;
4. the channels that hear it (``channels_hearing``): its agent's channels of the group's project
   and the operators' shared ones, not disabled, not digests (a digest channel hears a period's
   Signals in one message: ``consumers.digests``) - and none for a group that pages by incidents
   (``alertMode`` window or drift: ``consumers.incidents``), whose per-result Signals are the
   record, delivered to no one;
5. one delivery per channel that hears the Signal; with no Signal, the PagerDuty channels among
   them hear a recovery when the result is at or over the threshold (which resolves their
   incident);
6. an item for each review queue of the group that takes the result (``scoring.review_rules``),
   whatever the policy says of alerts - kept in Redis by the pair's finish, with the history.
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
