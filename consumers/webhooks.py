"""The webhook sender: deliveries from the webhooks topic, POSTed to the agents' alert channels.

Ingest, dispatch, outcome; deliveries follow Standard Webhooks 1.0 (``scorer_groups.signing``). The one
rule: every channel (its project, agent and URL) has its own lane and circuit breaker, so a dead or slow
channel never holds up another. The steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from adapters.egress import EgressPolicy, EgressRefused
from adapters.members.http import describe_status, no_cookies, post_capped
from adapters.stores import keys
from adapters.stores.channels import channel_id, legacy_channel_id
from adapters.stores.deliveries import (
    Attempt,
    DeliverySchedule,
    PagerDutyIncident,
    PendingDelivery,
    ScheduleWrites,
    shard_of,
)
from consumers.events import SILENT
from consumers.loop import PartitionLoop, Taken
from consumers.outage import OutageGuard
from consumers.webhook_lanes import Lane, SenderLimits, channel_label
from scorer_groups import signing
from scoring.backoff import retry_after_seconds
from scoring.catalog import CatalogSnapshot
from scoring.models import AlertChannel
from scoring.results import RECOVERED_EVENT, WebhookDelivery, channel_key
from scoring.webhooks.breaker import CircuitBreaker
from scoring.webhooks.retries import RetrySchedule

log = structlog.get_logger(__name__)

RETRY_STATUSES = frozenset({408, 429})  # besides 3xx and 5xx


class FailedDelivery(BaseModel):
    """The value on the webhooks dead-letter topic."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    # invalid_delivery | url_refused | rejected | channel_gone | channel_disabled | delivery_failed
    reason: str
    error: str
    delivery: Any
    attempts: tuple[Attempt, ...] = ()
    failed_at: datetime

    @property
    def kafka_key(self) -> bytes | None:
        return None

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


class WebhookEvents(Protocol):
    """What the sender reports; the worker makes metrics of it."""

    def delivery(self, channel: str, outcome: str) -> None: ...
    def breaker(self, channel: str, state: str) -> None: ...
    def channel_disabled(self, channel: str) -> None: ...
    def pending(self, count: int, oldest_s: float) -> None: ...


def _hash(channel: str) -> str:
    """A channel in a Redis key (its id holds the URL, which may carry credentials)."""
    return hashlib.sha256(channel.encode()).hexdigest()[:16]


class WebhookSender:
    def __init__(self, *, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, dlq_topic: str,
                 catalog: Callable[[], CatalogSnapshot], schedule: DeliverySchedule, retry: RetrySchedule,
                 egress: EgressPolicy, disable: Callable[[str, str], Awaitable[bool]],
                 limits: SenderLimits = SenderLimits(), events: WebhookEvents | None = None,
                 body: Callable[[AlertChannel, WebhookDelivery], bytes] | None = None,
                 outages: OutageGuard | None = None) -> None:
        self._catalog = catalog
        self._schedule = schedule
        self._retry = retry
        self._egress = egress
        self._disable = disable
        self._limits = limits
        self._events: WebhookEvents = events or SILENT
        self._body = body or (lambda _channel, delivery: delivery.to_json())
        self._outages = outages or OutageGuard()
        self.loop = PartitionLoop(name="webhooks", consumer=consumer, producer=producer, dlq_topic=dlq_topic,
                                  outages=self._outages, commit_interval_s=limits.commit_interval_s, max_batch=500,
                                  poll_timeout_ms=200)
        self._tasks: dict[asyncio.Task[None], WebhookDelivery] = {}  # attempt task -> the delivery it holds
        self._lanes: dict[str, Lane] = {}
        self._writes = ScheduleWrites()  # what ended attempts write to the schedule, sent in batches
        self._http = httpx.AsyncClient(follow_redirects=False, cookies=no_cookies(),
                                       headers={"User-Agent": "scorer-group-worker-webhooks"})
        self.delivered = 0  # for tests and logs
        self.failed: BaseException | None = None

    # --- 1. Ingest ------------------------------------------------------------------------

    def rebalance_listener(self) -> ConsumerRebalanceListener:
        return self.loop.rebalance_listener()

    @property
    def outage(self) -> str | None:
        return self.loop.outage

    async def run(self, stop: asyncio.Event) -> None:
        poller = asyncio.create_task(self._poll(stop), name="webhook-schedule-poller")
        flusher = asyncio.create_task(self._flush_writes(), name="webhook-schedule-writes")
        try:
            await self.loop.run(self, stop)
        except Exception as exc:  # Kafka or Redis away past the outage tolerance: stop; nothing committed is lost
            self.failed = exc
            log.exception("webhook sender stops")
            raise
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await self._let_attempts_finish()
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            await self._flush()
            await self._http.aclose()

    # The step (consumers.loop.Step): room for as many deliveries as may be held at once.

    def room(self) -> int:
        return self._limits.max_in_flight - len(self._tasks)

    def ended(self) -> bool:
        return False

    async def tick(self) -> None:
        return None

    async def take(self, batch: list[Taken]) -> None:
        now = time.time()
        fresh: list[PendingDelivery] = []
        incidents: list[PagerDutyIncident | None] = []
        scheduled: list[Taken] = []
        invalid: list[tuple[Taken | None, FailedDelivery]] = []
        for taken in batch:
            value = taken.record.value or b""
            try:
                delivery = WebhookDelivery.model_validate_json(value)
            except ValidationError as exc:
                invalid.append((taken, FailedDelivery(reason="invalid_delivery", error=str(exc)[:500],
                                                      delivery=value.decode(errors="replace"),
                                                      failed_at=datetime.now(UTC))))
                continue
            scheduled.append(taken)
            fresh.append(PendingDelivery(delivery=delivery, first_seen=datetime.fromtimestamp(now, UTC)))
            incidents.append(self._incident(delivery))
        await self.loop.dead_letter(invalid)
        # Durable before the offset moves; a Redis outage is waited out here, fetching nothing more.
        added = await self._outages.call(lambda: self._schedule.add_claimed(fresh, now, incidents))
        for ticket, record in scheduled:
            ticket.finished(record.offset)
        for pending, new in zip(fresh, added, strict=True):
            if new:
                self._dispatch(pending)

    def _channel(self, delivery: WebhookDelivery) -> AlertChannel | None:
        """The one channel a delivery goes to. The project's own channel and an operator's may
        both have its agent and URL (one delivery serves both: its id is the Signal's and the
        URL's); the enabled one is chosen, then the project's own, so a 410 disables just it."""
        channels = self._catalog().channels_for(delivery.agent_id, delivery.signal.project_id)
        if not delivery.channel:  # written before deliveries named channels by key
            matching = [c for c in channels if c.url == delivery.url]
        else:
            matching = [c for c in channels if channel_key(c.url) == delivery.channel]
        return min(matching, key=lambda c: (c.disabled, c.project_id is None), default=None)

    def _incident(self, delivery: WebhookDelivery) -> PagerDutyIncident | None:
        """PagerDuty channels: a trigger opens the group's incident, a recovery resolves it
        (and is not sent at all when none is open)."""
        channel = self._channel(delivery)
        if channel is None or channel.format != "pagerduty":
            return None
        s = delivery.signal  # an incident of the group's level has a key of its own (scoring.incidents)
        signal_key = f"incident:{s.incident_id}" if s.incident_id else s.key
        closes = delivery.event == RECOVERED_EVENT or s.state == "resolved"
        return PagerDutyIncident("close" if closes else "open",
                        keys.webhook_incident(shard_of(delivery), _hash(channel_id(channel)), signal_key),
                        keys.webhook_incident(shard_of(delivery), _hash(legacy_channel_id(channel)), signal_key))

    # --- 2. Dispatch ----------------------------------------------------------------------

    async def _poll(self, stop: asyncio.Event) -> None:
        last_stats = 0.0
        unsharded = True  # until deliveries of a version before the shards are moved to them
        turn, more = 0, False
        while not stop.is_set():
            backlog, more = more, False  # the last poll claimed all it had room for
            if unsharded:  # apart: a failed move must not keep the poll below from claiming
                try:
                    await self._move_unsharded()
                    unsharded = False
                except Exception:
                    log.warning("moving the unsharded webhook schedule failed; trying again", exc_info=True)
            try:
                room = self._limits.max_in_flight - len(self._tasks)
                if backlog:
                    shards: Sequence[int] = range(keys.WEBHOOK_SHARDS)
                else:
                    first, turn = turn, (turn + self._limits.shards_per_poll) % keys.WEBHOOK_SHARDS
                    shards = [(first + i) % keys.WEBHOOK_SHARDS for i in range(self._limits.shards_per_poll)]
                claimed = await self._schedule.claim_due(time.time(), room, shards)
                for pending in claimed:
                    self._dispatch(pending)
                more = room > 0 and len(claimed) == room  # a backlog: claim again soon, everywhere
                if time.monotonic() - last_stats >= self._limits.stats_s:
                    self._events.pending(*await self._schedule.stats(time.time()))
                    last_stats = time.monotonic()
            except Exception:
                log.warning("webhook schedule poll failed; trying again", exc_info=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self._limits.flush_s if more else self._limits.poll_s)

    async def _move_unsharded(self) -> None:
        incident_shards = {}  # unsharded incidents are older than projects in the channel id
        for channel in self._catalog().channels.values():
            if channel.format == "pagerduty":
                incident_shards[_hash(legacy_channel_id(channel))] = keys.webhook_shard(channel_key(channel.url))
        moved = await self._schedule.move_unsharded(incident_shards)
        if moved:
            log.info("webhook deliveries moved to the sharded schedule", deliveries=moved)

    async def _flush_writes(self) -> None:
        while True:
            await asyncio.sleep(self._limits.flush_s)
            await self._flush()

    async def _flush(self) -> None:
        """Send the schedule writes of the attempts that ended since the last flush, together:
        one round trip however many attempts ended (and one Redis connection)."""
        if not self._writes:
            return
        writes, self._writes = self._writes, ScheduleWrites()
        try:
            await self._outages.call(lambda: self._schedule.write(writes))
        except Exception:
            log.exception("webhook schedule writes failed; those deliveries come back when their claims run out",
                          deliveries=len(writes))

    def _dispatch(self, pending: PendingDelivery) -> None:
        task = asyncio.create_task(self._deliver(pending))
        self._tasks[task] = pending.delivery
        task.add_done_callback(self._attempt_ended)

    def _attempt_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        self.loop.freed()
        if not task.cancelled() and task.exception() is not None:
            # Redis or the dead-letter topic refused: the claim runs out and the delivery is
            # claimed again (here or elsewhere), nothing is lost.
            log.error("webhook delivery could not be settled; it is tried again after its lease",
                      error=repr(task.exception()))

    async def _deliver(self, pending: PendingDelivery) -> None:
        delivery = pending.delivery
        channel = self._channel(delivery)
        if channel is None:
            log.info("alert channel removed; delivery dropped", agent=delivery.agent_id, delivery=delivery.id)
            self._writes.finish(delivery, "dead")
            return
        if channel.disabled:
            await self._dead_letter(pending, "channel_disabled", f"the channel is disabled: {channel.disabled_reason}")
            return
        lane = self._lane(channel)
        expected = lane.expected_wait(time.monotonic(), self._limits.channel_concurrency)
        if lane.waiting >= self._limits.channel_backlog or expected > self._limits.lane_wait_s:
            # This channel is behind: the delivery waits in Redis, not here, holding nothing.
            self._writes.postpone(delivery, time.time() + min(max(expected, 1.0), 60.0))
            return
        lane.waiting += 1
        try:
            await asyncio.wait_for(lane.slots.acquire(), timeout=self._limits.max_wait_s)
        except TimeoutError:
            self._writes.postpone(delivery, time.time() + 1.0)  # put back before the claim runs out
            return
        finally:
            lane.waiting -= 1
        started = time.monotonic()
        lane.running.append(started)
        try:
            now = time.time()
            if not lane.breaker.allows(now):
                self._writes.postpone(delivery, lane.breaker.next_try(now))
                return
            await self._attempt(pending, channel, lane)
            lane.observe(time.monotonic() - started)
        finally:
            lane.running.remove(started)
            lane.slots.release()
            self._report_breaker(channel, lane)

    def _lane(self, channel: AlertChannel) -> Lane:
        key = channel_id(channel)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(
                asyncio.Semaphore(self._limits.channel_concurrency),
                CircuitBreaker(failures=self._limits.breaker_failures, open_s=self._limits.breaker_open_s))
        return lane

    def _report_breaker(self, channel: AlertChannel, lane: Lane) -> None:
        if lane.breaker.state != lane.reported_state:
            lane.reported_state = lane.breaker.state
            log.warning("alert channel circuit breaker", channel=channel_label(channel), state=lane.breaker.state)
        self._events.breaker(channel_label(channel), lane.breaker.state)

    # --- 4. One attempt and its outcome ---------------------------------------------------

    async def _attempt(self, pending: PendingDelivery, channel: AlertChannel, lane: Lane) -> None:
        delivery = pending.delivery
        now = time.time()
        attempt, retry_after = await self._post(channel, delivery, now)
        pending = pending.with_attempt(attempt)
        self._events.delivery(channel_label(channel), attempt.outcome)
        if attempt.outcome == "delivered":
            lane.breaker.succeeded()
            self._writes.finish(delivery, "delivered")
            self.delivered += 1
            return
        if attempt.outcome == "refused":
            await self._dead_letter(pending, "url_refused", attempt.error or "")
            return
        if attempt.outcome == "rejected":
            await self._dead_letter(pending, "rejected", attempt.error or "")
            return
        if attempt.outcome == "gone":
            await self._disable_channel(channel, f"the receiver answered {attempt.error}")
            await self._dead_letter(pending, "channel_gone", attempt.error or "")
            return
        lane.breaker.failed(now)
        wait = self._retry.wait(len(pending.attempts), retry_after)
        if wait is None:
            await self._dead_letter(pending, "delivery_failed",
                                    f"{attempt.error} (after {len(pending.attempts)} attempts)")
        else:
            self._writes.retry(pending, now + wait)
        failing_for = lane.breaker.failing_for(now)
        if lane.breaker.state == "open" and failing_for >= self._limits.disable_after_s:
            await self._disable_channel(channel, f"failing without a success for {failing_for:.0f}s")

    async def _post(self, channel: AlertChannel, delivery: WebhookDelivery,
                    now: float) -> tuple[Attempt, float | None]:
        at = datetime.fromtimestamp(now, UTC)
        try:
            target = await self._egress.check(channel.url)  # the catalog's URL: the record's is masked
        except EgressRefused as exc:
            return Attempt(at=at, outcome="failed" if exc.retriable else "refused", error=str(exc)), None
        body = self._body(channel, delivery)
        headers = {"Content-Type": "application/json", **target.headers,
                   **signing.headers(delivery.id, int(now), body, channel.signing_secrets(now))}
        try:
            response = await post_capped(self._http, target.url, content=body, headers=headers,
                                         extensions=target.extensions, io_timeout_s=self._limits.timeout_s,
                                         what="the receiver", cut=True)
        except httpx.TimeoutException:
            return Attempt(at=at, outcome="failed", error="the receiver timed out"), None
        except httpx.TransportError as exc:
            return Attempt(at=at, outcome="failed", error=f"the receiver is unreachable ({type(exc).__name__})"), None
        status = response.status
        error = describe_status(status, response.body)
        if response.ok:
            return Attempt(at=at, outcome="delivered", status=status), None
        if status == 410:
            return Attempt(at=at, outcome="gone", status=status, error=error), None
        if 400 <= status < 500 and status not in RETRY_STATUSES:
            return Attempt(at=at, outcome="rejected", status=status, error=error), None
        if status in (301, 302, 303, 307, 308) and "location" in response.headers:
            error += " (redirects are not followed)"
        return (Attempt(at=at, outcome="failed", status=status, error=error),
                retry_after_seconds(response.headers.get("retry-after")))

    async def _disable_channel(self, channel: AlertChannel, reason: str) -> None:
        if await self._disable(channel_id(channel), reason):
            log.error("alert channel disabled", channel=channel_label(channel), reason=reason)
            self._events.channel_disabled(channel_label(channel))

    async def _dead_letter(self, pending: PendingDelivery, reason: str, error: str) -> None:
        failed = FailedDelivery(reason=reason, error=error,
                                delivery=pending.delivery.model_dump(mode="json", by_alias=True),
                                attempts=pending.attempts, failed_at=datetime.now(UTC))
        await self.loop.dead_letter([(None, failed)])
        self._writes.finish(pending.delivery, "dead")

    # --- Shutdown and offsets -------------------------------------------------------------

    async def _let_attempts_finish(self) -> None:
        """Attempts under way may end (they are bounded by the timeout); deliveries still waiting
        for a slot are put back as due now, for the next worker to claim at once."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self._limits.timeout_s + 1)
        now = time.time()
        for task, delivery in list(self._tasks.items()):
            task.cancel()
            self._writes.postpone(delivery, now)
