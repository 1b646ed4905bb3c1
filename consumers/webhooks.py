"""The webhook sender: deliveries from the webhooks topic, POSTed to the agents' alert channels.

Each delivery is signed with its channel's secret (looked up in the catalog: secrets never
travel on a topic) and retried with backoff on 429, 5xx and transport failures. A delivery
that cannot be made - its URL is refused by the private-network guard, or the receiver keeps
failing - goes to the webhooks dead-letter topic with the reason; one whose channel was deleted
meanwhile is dropped with a log line. Offsets are committed only past finished deliveries.

Deliveries follow Standard Webhooks 1.0 (see ``scoring.signing``): receivers verify
``webhook-signature`` with the channel's ``whsec_`` secret and deduplicate on ``webhook-id``
(the delivery's id, the same on every retry and redelivery).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from consumers.offsets import CommitOnRevoke, OffsetTracker
from scoring import signing
from scoring.catalog import CatalogSnapshot
from scoring.egress import EgressPolicy, EgressRefused, Target
from scoring.http import MemberError, RetryPolicy, post_json
from scoring.results import WebhookDelivery

log = structlog.get_logger(__name__)

DELIVERY_RETRY = RetryPolicy(attempts=5, backoff_base_s=0.5, backoff_cap_s=10.0)


class FailedDelivery(BaseModel):
    """The value on the webhooks dead-letter topic."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    reason: str  # "invalid_delivery" | "url_refused" | "delivery_failed"
    error: str
    delivery: Any
    failed_at: datetime

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


class WebhookSender:
    def __init__(self, *, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, dlq_topic: str,
                 catalog: Callable[[], CatalogSnapshot], egress: EgressPolicy, concurrency: int = 32,
                 timeout_s: float = 60.0, commit_interval_s: float = 1.0,
                 policy: RetryPolicy = DELIVERY_RETRY) -> None:
        self._consumer = consumer
        self._producer = producer
        self._dlq_topic = dlq_topic
        self._catalog = catalog
        self._egress = egress
        self._concurrency = concurrency
        self._timeout_s = timeout_s
        self._commit_interval_s = commit_interval_s
        self._policy = policy
        self._offsets = OffsetTracker()
        self._tasks: set[asyncio.Task[None]] = set()
        self._http = httpx.AsyncClient(follow_redirects=False,
                                       headers={"User-Agent": "scorer-group-worker-webhooks"})
        self.delivered = 0  # for tests and logs
        self.failed: BaseException | None = None

    async def run(self, stop: asyncio.Event) -> None:
        last_commit = time.monotonic()
        try:
            while not stop.is_set() and self.failed is None:
                room = self._concurrency - len(self._tasks)
                if room <= 0:
                    await asyncio.wait(self._tasks, timeout=self._commit_interval_s,
                                       return_when=asyncio.FIRST_COMPLETED)
                else:
                    batches = await self._consumer.getmany(timeout_ms=200, max_records=room)
                    for tp, records in batches.items():
                        for record in records:
                            self._start(tp, record.offset, record.value)
                if time.monotonic() - last_commit >= self._commit_interval_s:
                    await self._commit()
                    last_commit = time.monotonic()
        finally:
            if self._tasks:  # finish what was started; deliveries are short and bounded
                await asyncio.wait(self._tasks, timeout=self._timeout_s)
            await self._commit()
            await self._http.aclose()

    def _start(self, tp: TopicPartition, offset: int, value: bytes | None) -> None:
        ticket = self._offsets.started(tp, offset)
        task = asyncio.create_task(self._handle(value))
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is None:
                ticket.finished(offset)
            elif not t.cancelled():
                # Not even the dead-letter topic took it: stop, so the record is redelivered
                # after a restart instead of holding the partition's commit back forever.
                self.failed = self.failed or t.exception()
                log.error("webhook delivery could not be finished; the sender stops", error=repr(t.exception()))

        task.add_done_callback(done)

    async def _handle(self, value: bytes | None) -> None:
        try:
            delivery = WebhookDelivery.model_validate_json(value or b"")
        except ValidationError as exc:
            await self._dead_letter("invalid_delivery", str(exc)[:500], (value or b"").decode(errors="replace"))
            return
        channel = next((c for c in self._catalog().channels_for(delivery.agent_id) if c.url == delivery.url),
                       None)
        if channel is None:
            log.info("alert channel removed; delivery dropped", agent=delivery.agent_id, delivery=delivery.id)
            return
        try:
            target = await self._checked(delivery.url)
        except EgressRefused as exc:
            await self._dead_letter("url_refused", str(exc), delivery.model_dump(mode="json", by_alias=True))
            return
        body = delivery.to_json()
        now = time.time()
        headers = signing.headers(delivery.id, int(now), body, channel.signing_secrets(now))
        deadline = asyncio.get_running_loop().time() + self._timeout_s
        try:
            await post_json(self._http, target.url, body, what="webhook receiver", deadline=deadline,
                            headers={**headers, **target.headers}, extensions=target.extensions,
                            policy=self._policy)
        except MemberError as exc:
            await self._dead_letter("delivery_failed", str(exc), delivery.model_dump(mode="json", by_alias=True))
            return
        self.delivered += 1

    async def _checked(self, url: str) -> Target:
        """The private-network guard, with a name that does not resolve right now retried."""
        for attempt in range(self._policy.attempts):
            try:
                return await self._egress.check(url)
            except EgressRefused as exc:
                if not exc.retriable or attempt == self._policy.attempts - 1:
                    raise
                await asyncio.sleep(self._policy.backoff(attempt))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _dead_letter(self, reason: str, error: str, delivery: Any) -> None:
        log.warning("webhook delivery dead-lettered", reason=reason, error=error[:300])
        failed = FailedDelivery(reason=reason, error=error, delivery=delivery, failed_at=datetime.now(UTC))
        await (await self._producer.send(self._dlq_topic, value=failed.to_json()))

    def rebalance_listener(self) -> CommitOnRevoke:
        return CommitOnRevoke(lambda revoked: self._commit(only=revoked), tracker=self._offsets)

    async def _commit(self, only: set[TopicPartition] | None = None) -> None:
        moves = {tp: o for tp, o in self._offsets.to_commit().items() if only is None or tp in only}
        if moves:
            await self._consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in moves.items()})
            self._offsets.committed(moves)
