"""Publishing group results: a Rating for every result, a Signal below the alert threshold (or,
at most once per group and interval, for a result without a score: ``scoring.stores.alerts``),
and one webhook delivery per Signal and alert channel of the agent.

Records are handed to the producer without waiting - many for one partition as whole producer
batches, a few as plain sends; the caller gets the ratings back only once the broker has
acknowledged every batch, which is when a result counts as done. Partitions are chosen exactly as
the producer itself would (murmur2 of the key), so a trace's ratings, Signals and deliveries land
where a plain ``send`` would have put them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from consumers.events import PipelineEvents
from consumers.judge_export import JudgeCallSink
from scoring.catalog import CatalogSnapshot
from scoring.otlp.judge_spans import call_spans
from scoring.panel import GroupResult
from scoring.results import (
    PublishedRating,
    RatingOrigin,
    ResultScope,
    Signal,
    build_deliveries,
    build_no_score_signal,
    build_recovery_deliveries,
    build_signal,
    encode_rating,
    no_score_due,
    no_score_signal_id,
)
from scoring.stores.alerts import NoScoreAlerts

_partition_of = DefaultPartitioner()

# From this many records for one partition in one publish, they go as whole producer batches.
BULK_RECORDS = 16


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
                      snapshot: CatalogSnapshot) -> list[PublishedRating]:
        records: list[tuple[str, bytes | None, bytes]] = []  # (topic, key, value), in order
        ratings = [encode_rating(result, scope, origin=self.policy.origin) for result in results]
        no_score = await self._no_score_due(results, ratings) if self.policy.signals else set()
        for result, rating in zip(results, ratings, strict=True):
            group, subject = result.group, result.subject
            key = subject.session_id if scope == "session" else subject.trace_id
            records.append((self._topics.ratings, key.encode() if key else None, rating.document))
            self._events.group_scored(group.project_id, group.id, scope, rating.rating)
            if not self.policy.signals:  # a backfill's: last week's traffic pages nobody
                continue
            signal: Signal | None = build_signal(group, rating)
            if signal is None and no_score_signal_id(rating) in no_score:
                signal = build_no_score_signal(group, rating)
            # Agent ids are the tenants' own: only this project's (and operators' shared) channels.
            # A group alerting on windows or drift pages by incidents (consumers.incidents): its
            # per-result Signals are the record, delivered to no one.
            each = group.online is None or group.online.alert_mode == "each"
            # A digest channel hears a period's Signals in one message (consumers.digests).
            channels = [c for c in snapshot.channels_for(subject.agent_id, group.project_id)
                        if not c.disabled and c.digest_seconds is None] if each else []
            if signal is None:  # PagerDuty channels hear when the group is back over its threshold
                resolving = [c.url for c in channels if c.format == "pagerduty"]
                for delivery in build_recovery_deliveries(group, rating, resolving):
                    records.append((self._topics.webhooks, delivery.agent_id.encode(), delivery.to_json()))
                continue
            records.append((self._topics.signals, signal.key.encode(), signal.to_json()))
            self._events.signal_raised(group.project_id, group.id, signal.severity)
            for delivery in build_deliveries(signal, [c.url for c in channels]):
                records.append((self._topics.webhooks, delivery.agent_id.encode(), delivery.to_json()))
        await self.send(records)
        if self._judge_calls is not None:  # telemetry after the results: queued, never awaited
            for result, rating in zip(results, ratings, strict=True):
                self._judge_calls.add(call_spans(result, rating.id))
        return ratings

    async def _no_score_due(self, results: list[GroupResult], ratings: list[PublishedRating]) -> set[str]:
        """The no-score Signals this publish raises (one round trip, and only when some result
        of an alerting group has no score)."""
        candidates = [(r.group.project_id, r.group.id, no_score_signal_id(rating))
                      for r, rating in zip(results, ratings, strict=True) if no_score_due(r.group, rating)]
        if not candidates or self._alerts is None:
            return set()
        return await self._alerts.due(candidates)

    async def send(self, records: list[tuple[str, bytes | None, bytes]]) -> None:
        """Send ``records`` and wait until the broker has acknowledged all of them.

        1. each record's partition, as the producer would choose it (murmur2 of the key);
        2. a partition with many records gets them as whole producer batches, each handed over
           at once; a partition with few gets plain sends, which join the producer's open batch
           (a whole batch waits for the one before it to leave: right for bulk, slow for one);
        3. every acknowledgement awaited together.
        """
        partitions: dict[str, list[int]] = {}
        for topic in {topic for topic, _, _ in records}:
            partitions[topic] = sorted(await self._producer.partitions_for(topic))
        by_partition: dict[tuple[str, int], list[tuple[bytes | None, bytes]]] = {}
        chosen: dict[tuple[str, bytes], tuple[str, int]] = {}  # a trace's records share a key
        for topic, key, value in records:
            where = chosen.get((topic, key)) if key is not None else None
            if where is None:  # (no key: a partition of the producer's choice, for each record)
                where = (topic, _partition_of(key, partitions[topic], partitions[topic]))
                if key is not None:
                    chosen[(topic, key)] = where
            by_partition.setdefault(where, []).append((key, value))
        acks: list[asyncio.Future[Any]] = []
        for (topic, partition), items in by_partition.items():
            if len(items) < BULK_RECORDS:
                for key, value in items:
                    acks.append(await self._producer.send(topic, key=key, value=value, partition=partition))
                continue
            batch = self._producer.create_batch()
            for key, value in items:
                if batch.append(key=key, value=value, timestamp=None) is None:  # full: send it
                    acks.append(await self._submit(batch, topic, partition))
                    batch = self._producer.create_batch()
                    batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any record
            acks.append(await self._submit(batch, topic, partition))
        await asyncio.gather(*acks)

    async def _submit(self, batch: Any, topic: str, partition: int) -> asyncio.Future[Any]:
        batch.close()  # no plain ``send`` may add to it behind our back
        future: asyncio.Future[Any] = await self._producer.send_batch(batch, topic, partition=partition)
        return future
