"""Publishing group results: a Rating for every result, a Signal below the alert threshold, and
one webhook delivery per Signal and alert channel of the agent.

Every record is handed to the producer without waiting for it; the caller gets the ratings back
only once the broker has acknowledged all of them, which is when a result counts as done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

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
        acks: list[Awaitable[Any]] = []
        ratings = []
        for result in results:
            group, subject = result.group, result.subject
            rating = build_rating(result, scope)
            ratings.append(rating)
            key = subject.trace_id if scope == "trace" else subject.session_id
            acks.append(await self._producer.send(self._topics.ratings, key=key.encode() if key else None,
                                                  value=rating.to_json()))
            self._events.group_scored(group.project_id, group.id, scope, rating.rating)
            signal = build_signal(group, rating)
            # Agent ids are the tenants' own: only this project's (and operators' shared) channels.
            channels = [c for c in snapshot.channels_for(subject.agent_id, group.project_id) if not c.disabled]
            if signal is None:  # PagerDuty channels hear when the group is back over its threshold
                resolving = [c.url for c in channels if c.format == "pagerduty"]
                for delivery in build_recovery_deliveries(group, rating, resolving):
                    acks.append(await self._producer.send(self._topics.webhooks, key=delivery.agent_id.encode(),
                                                          value=delivery.to_json()))
                continue
            acks.append(await self._producer.send(self._topics.signals, key=signal.key.encode(),
                                                  value=signal.to_json()))
            self._events.signal_raised(group.project_id, group.id, signal.severity)
            for delivery in build_deliveries(signal, [c.url for c in channels]):
                acks.append(await self._producer.send(self._topics.webhooks, key=delivery.agent_id.encode(),
                                                      value=delivery.to_json()))
        await asyncio.gather(*acks)
        return ratings
