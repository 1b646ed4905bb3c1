"""Publishing scored results: ``scoring.outbox`` decides what they publish (each result's
rating, its Signal and its webhook deliveries), ``consumers.sender`` sends it. The caller gets the
ratings back only once the broker has acknowledged every record, which is when a result counts as
done. ``Outputs.send`` takes any ``Record`` (the incident watcher's, the digest sender's)."""

from __future__ import annotations

from typing import NamedTuple

from aiokafka import AIOKafkaProducer

from adapters.stores.alerts import NoScoreAlerts
from consumers.events import PipelineEvents
from consumers.judge_export import JudgeCallSink
from consumers.sender import BULK_RECORDS, send_records
from scorer_groups.review_queues import ReviewQueue
from scoring.catalog import CatalogSnapshot
from scoring.otlp.judge_spans import call_spans
from scoring.outbox import BACKFILL, BACKFILL_ALERTING, LIVE, PublishPolicy, Record, TopicNames, outbox
from scoring.panel import GroupResult
from scoring.results import PublishedRating, ResultScope, encode_rating, no_score_due, no_score_signal_id
from scoring.review_rules import KeptItem

__all__ = ["BACKFILL", "BACKFILL_ALERTING", "BULK_RECORDS", "LIVE", "Outputs", "PublishPolicy", "TopicNames"]


class Published(NamedTuple):
    """What a publish sent: each result's rating, in order, and the review items they make (by
    rating id, each with its queue)."""

    ratings: list[PublishedRating]
    review_items: dict[str, list[tuple[KeptItem, ReviewQueue]]]


class Outputs:
    def __init__(self, producer: AIOKafkaProducer, topics: TopicNames, events: PipelineEvents,
                 alerts: NoScoreAlerts | None = None, policy: PublishPolicy = LIVE,
                 judge_calls: JudgeCallSink | None = None) -> None:
        self._producer = producer
        self._topics = topics
        self._events = events
        self._alerts = alerts  # None: no no-score Signals (tests of other steps)
        self.policy = policy
        self._judge_calls = judge_calls  # None: judge calls are not exported as spans

    async def publish(self, results: list[GroupResult], scope: ResultScope,
                      snapshot: CatalogSnapshot) -> Published:
        """1. each result's rating document; 2. the no-score Signals due (one round trip, only
        when some result has none); 3. what they publish (``scoring.outbox``); 4. sent and
        acknowledged; 5. their judge calls queued for export. The review items they make are the
        caller's to keep (with the history: ``consumers.pair_protocol``)."""
        ratings = [encode_rating(result, scope, origin=self.policy.origin) for result in results]
        no_score = await self._no_score_due(results, ratings) if self.policy.signals else set()
        box = outbox([(r.group, r.subject, rating) for r, rating in zip(results, ratings, strict=True)],
                     scope, snapshot, self.policy, self._topics, no_score)
        for result, rating in zip(results, ratings, strict=True):
            self._events.group_scored(result.group.project_id, result.group.id, scope, rating.rating)
        for signal in box.signals:
            self._events.signal_raised(signal.project_id, signal.group_id, signal.severity)
        await self.send(box.records)
        if self._judge_calls is not None:  # telemetry after the results: queued, never awaited
            for result, rating in zip(results, ratings, strict=True):
                self._judge_calls.add(call_spans(result, rating.id))
        return Published(ratings, box.review_items)

    async def _no_score_due(self, results: list[GroupResult], ratings: list[PublishedRating]) -> set[str]:
        """The no-score Signals this publish raises (one round trip, and only when some result
        of an alerting group has no score)."""
        candidates = [(r.group.project_id, r.group.id, no_score_signal_id(rating))
                      for r, rating in zip(results, ratings, strict=True) if no_score_due(r.group, rating)]
        if not candidates or self._alerts is None:
            return set()
        return await self._alerts.due(candidates)

    async def send(self, records: list[Record]) -> None:
        """Send ``records`` and wait until the broker has acknowledged all of them."""
        await send_records(self._producer, records)
