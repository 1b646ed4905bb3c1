"""Publishing group results: a Rating for every result, a Signal below the alert threshold, and
one webhook delivery per Signal and alert channel of the agent.

Records are sent in bulk: gathered per (topic, partition) into producer batches, each handed to
the producer without waiting; the caller gets the ratings back only once the broker has
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
from scoring.panel import GroupResult
from scoring.results import (
    Rating,
    ResultScope,
    build_deliveries,
    build_rating,
    build_recovery_deliveries,
    build_signal,
)
from scoring.stores.catalog import CatalogSnapshot

_partition_of = DefaultPartitioner()


@dataclass(frozen=True)
class TopicNames:
    traces: str
    ratings: str
    signals: str
    webhooks: str
    dlq: str


class Outputs:
    def __init__(self, producer: AIOKafkaProducer, topics: TopicNames, events: PipelineEvents) -> None:
        self._producer = producer
        self._topics = topics
        self._events = events

    async def publish(self, results: list[GroupResult], scope: ResultScope,
                      snapshot: CatalogSnapshot) -> list[Rating]:
        records: list[tuple[str, bytes | None, bytes]] = []  # (topic, key, value), in order
        ratings = []
        for result in results:
            group, subject = result.group, result.subject
            rating = build_rating(result, scope)
            ratings.append(rating)
            key = subject.trace_id if scope == "trace" else subject.session_id
            records.append((self._topics.ratings, key.encode() if key else None, rating.to_json()))
            self._events.group_scored(group.project_id, group.id, scope, rating.rating)
            signal = build_signal(group, rating)
            # Agent ids are the tenants' own: only this project's (and operators' shared) channels.
            channels = [c for c in snapshot.channels_for(subject.agent_id, group.project_id) if not c.disabled]
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
        return ratings

    async def send(self, records: list[tuple[str, bytes | None, bytes]]) -> None:
        """Send ``records`` and wait until the broker has acknowledged all of them.

        1. per topic, its partitions (known metadata: no round trip after the first time);
        2. each record appended to its (topic, partition)'s open batch; a full batch is handed to
           the producer at once (its order within the partition kept) and a new one opened;
        3. the last batches handed over, then every acknowledgement awaited together.
        """
        partitions: dict[str, list[int]] = {}
        for topic in {topic for topic, _, _ in records}:
            partitions[topic] = sorted(await self._producer.partitions_for(topic))
        open_batches: dict[tuple[str, int], Any] = {}
        acks: list[asyncio.Future[Any]] = []
        for topic, key, value in records:
            where = (topic, _partition_of(key, partitions[topic], partitions[topic]))
            batch = open_batches.get(where)
            if batch is None:
                batch = open_batches[where] = self._producer.create_batch()
            if batch.append(key=key, value=value, timestamp=None) is None:  # full: send it, open the next
                acks.append(await self._submit(batch, where))
                batch = open_batches[where] = self._producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any record
        for where, batch in open_batches.items():
            acks.append(await self._submit(batch, where))
        await asyncio.gather(*acks)

    async def _submit(self, batch: Any, where: tuple[str, int]) -> asyncio.Future[Any]:
        batch.close()  # no plain ``send`` may add to it behind our back
        future: asyncio.Future[Any] = await self._producer.send_batch(batch, where[0], partition=where[1])
        return future
