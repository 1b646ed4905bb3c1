"""The webhook sender: deliveries from the webhooks topic, POSTed to the agents' alert channels.

1. Ingest: a batch of records from the webhooks topic is written to the durable schedule in
   Redis (``scoring.stores.deliveries``) in one script call - malformed records go to the
   webhooks dead-letter topic - and only then do their offsets become committable. A record
   seen before (a redelivery) is not scheduled again.
2. Dispatch: fresh deliveries are attempted at once; due retries are claimed from Redis every
   ``poll_s`` by whichever worker is alive, so restarts and rebalances resume them.
3. Isolation: every channel has its own lane - a few attempts at a time and a circuit breaker
   (``scoring.webhooks.breaker``). A dead or slow channel fills only its own lane; what does not fit is
   put back in the schedule without counting an attempt, so it never holds up another channel.
4. Outcome of an attempt: 2xx delivered; 3xx (redirects are not followed), 408, 429, 5xx and
   transport failures are retried on the schedule (Retry-After honoured); 410 Gone disables the
   channel; other 4xx are final. A final failure or an exhausted schedule goes to the dead-letter
   topic with the attempt history (``scorer-worker webhooks replay`` sends it again). A channel
   failing without a success for ``disable_after_s`` is disabled.

A Redis or broker outage is waited out (``consumers.outage``): ingest stops fetching and the
schedule's writes are retried, up to the outage tolerance.

Deliveries follow Standard Webhooks 1.0 (``scorer_groups.signing``): receivers verify
``webhook-signature`` with the channel's ``whsec_`` secret and deduplicate on ``webhook-id``
(the delivery's id, the same on every retry, redelivery and replay).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx
import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from consumers.offsets import CommitOnRevoke, Committer
from consumers.outage import OutageGuard
from scorer_groups import signing
from scoring.catalog import CatalogSnapshot
from scoring.egress import EgressPolicy, EgressRefused
from scoring.members.http import describe_status, retry_after_seconds
from scoring.models import AlertChannel
from scoring.results import RECOVERED_EVENT, WebhookDelivery, channel_key
from scoring.stores import keys
from scoring.stores.channels import channel_id
from scoring.stores.deliveries import Attempt, DeliverySchedule, Incident, PendingDelivery, Settlements, shard_of
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

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


class WebhookEvents(Protocol):
    """What the sender reports; the worker makes metrics of it."""

    def delivery(self, channel: str, outcome: str) -> None: ...
    def breaker(self, channel: str, state: str) -> None: ...
    def channel_disabled(self, channel: str) -> None: ...
    def pending(self, count: int, oldest_s: float) -> None: ...


class NoWebhookEvents:
    def delivery(self, channel: str, outcome: str) -> None: pass
    def breaker(self, channel: str, state: str) -> None: pass
    def channel_disabled(self, channel: str) -> None: pass
    def pending(self, count: int, oldest_s: float) -> None: pass


def channel_label(channel: AlertChannel) -> str:
    """A metric and log label for a channel: the agent and a short hash of the URL (URLs may
    carry credentials)."""
    return f"{channel.agent_id}#{hashlib.sha256(channel.url.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class SenderLimits:
    timeout_s: float = 10.0  # one attempt
    channel_concurrency: int = 4  # attempts at once per channel
    channel_backlog: int = 128  # claimed deliveries waiting per channel, at most
    lane_wait_s: float = 5.0  # a channel takes a delivery only if it expects to start it within this
    max_in_flight: int = 512  # claimed deliveries held by this worker
    breaker_failures: int = 5
    breaker_open_s: float = 30.0
    disable_after_s: float = 86_400.0
    poll_s: float = 0.5
    # Due retries are looked for in this many of the schedule's shards a poll, in turn (all of
    # them while a backlog is claimed): each shard every 2 s at the default poll, at a quarter of
    # the commands - polling is what every worker does all the time, whatever the traffic.
    shards_per_poll: int = 4
    stats_s: float = 5.0  # how often the pending count and oldest age are read (every shard)
    flush_s: float = 0.05  # how often the schedule's writes are sent (one round trip each time)
    commit_interval_s: float = 1.0

    @property
    def max_wait_s(self) -> float:
        """The longest a delivery waits for its channel's slot before it is put back."""
        return 4 * self.lane_wait_s + 20.0

    @property
    def lease_s(self) -> float:
        """How long a claim lasts: the longest wait for a slot, the attempt, and room."""
        return self.max_wait_s + self.timeout_s + 30.0


@dataclass
class Lane:
    """One channel's share of the sender: its slots, its breaker, and how long its attempts take
    (so a slow channel is given only the deliveries it can start soon)."""

    slots: asyncio.Semaphore
    breaker: CircuitBreaker
    waiting: int = 0
    running: list[float] = field(default_factory=list)  # monotonic start of each attempt under way
    latency_s: float | None = None  # moving average of attempt durations
    reported_state: str = "closed"

    PRIOR_LATENCY_S = 0.25  # until a channel has answered once

    def expected_wait(self, now: float, concurrency: int) -> float:
        """Seconds until one more delivery would start: the work ahead of it, at the channel's
        pace (an attempt still under way counts for as long as it has run)."""
        oldest = now - min(self.running) if self.running else 0.0
        latency = max(self.PRIOR_LATENCY_S if self.latency_s is None else self.latency_s, oldest, 0.001)
        return (self.waiting + len(self.running)) / concurrency * latency

    def observe(self, seconds: float) -> None:
        self.latency_s = seconds if self.latency_s is None else 0.8 * self.latency_s + 0.2 * seconds


class WebhookSender:
    def __init__(self, *, consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, dlq_topic: str,
                 catalog: Callable[[], CatalogSnapshot], schedule: DeliverySchedule, retry: RetrySchedule,
                 egress: EgressPolicy, disable: Callable[[str, str], Awaitable[bool]],
                 limits: SenderLimits = SenderLimits(), events: WebhookEvents | None = None,
                 body: Callable[[AlertChannel, WebhookDelivery], bytes] | None = None,
                 outages: OutageGuard | None = None) -> None:
        self._consumer = consumer
        self._producer = producer
        self._dlq_topic = dlq_topic
        self._catalog = catalog
        self._schedule = schedule
        self._retry = retry
        self._egress = egress
        self._disable = disable
        self._limits = limits
        self._events = events or NoWebhookEvents()
        self._body = body or (lambda _channel, delivery: delivery.to_json())
        self._outages = outages or OutageGuard(tolerance_s=120.0)
        self._committer = Committer(consumer, limits.commit_interval_s)
        self._offsets = self._committer.tracker
        self._tasks: dict[asyncio.Task[None], WebhookDelivery] = {}  # attempt task -> the delivery it holds
        self._lanes: dict[str, Lane] = {}
        self._writes = Settlements()  # what ended attempts write to the schedule, sent in batches
        self._http = httpx.AsyncClient(follow_redirects=False,
                                       headers={"User-Agent": "scorer-group-worker-webhooks"})
        self.delivered = 0  # for tests and logs
        self.failed: BaseException | None = None

    # --- 1. Ingest ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        poller = asyncio.create_task(self._poll(stop), name="webhook-schedule-poller")
        flusher = asyncio.create_task(self._flush_writes(), name="webhook-schedule-writes")
        try:
            while not stop.is_set() and self.failed is None:
                if len(self._tasks) >= self._limits.max_in_flight:
                    await asyncio.wait(list(self._tasks), timeout=self._limits.poll_s,
                                       return_when=asyncio.FIRST_COMPLETED)
                else:
                    batches = await self._consumer.getmany(timeout_ms=200, max_records=500)
                    if batches:
                        await self._ingest(batches)
                if self._committer.due:
                    await self._committer.commit()
        except Exception as exc:  # Kafka or Redis gone for good: stop; nothing committed is lost
            self.failed = exc
            log.exception("webhook sender stops")
        finally:
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller
            await self._let_attempts_finish()
            flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flusher
            await self._flush()
            with contextlib.suppress(Exception):
                await self._committer.commit()
            await self._http.aclose()

    async def _ingest(self, batches: dict[TopicPartition, list[Any]]) -> None:
        now = time.time()
        fresh: list[PendingDelivery] = []
        incidents: list[Incident | None] = []
        acks = []
        finished = []
        for tp, records in batches.items():
            for record in records:
                finished.append((self._offsets.started(tp, record.offset), record.offset))
                try:
                    delivery = WebhookDelivery.model_validate_json(record.value or b"")
                except ValidationError as exc:
                    value = (record.value or b"").decode(errors="replace")
                    acks.append(await self._send_dead_letter("invalid_delivery", str(exc)[:500], value))
                    continue
                fresh.append(PendingDelivery(delivery=delivery, first_seen=datetime.fromtimestamp(now, UTC)))
                incidents.append(self._incident(delivery))
        # Durable before the offset moves; a Redis outage is waited out here, fetching nothing more.
        added = await self._outages.call(lambda: self._schedule.add_claimed(fresh, now, incidents))
        await asyncio.gather(*acks)
        for ticket, offset in finished:
            ticket.finished(offset)
        for pending, new in zip(fresh, added, strict=True):
            if new:
                self._dispatch(pending)

    def _channel(self, delivery: WebhookDelivery) -> AlertChannel | None:
        channels = self._catalog().channels_for(delivery.agent_id, delivery.signal.project_id)
        if not delivery.channel:  # written before deliveries named channels by key
            return next((c for c in channels if c.url == delivery.url), None)
        return next((c for c in channels if channel_key(c.url) == delivery.channel), None)

    def _incident(self, delivery: WebhookDelivery) -> Incident | None:
        """PagerDuty channels: a trigger opens the group's incident, a recovery resolves it
        (and is not sent at all when none is open)."""
        channel = self._channel(delivery)
        if channel is None or channel.format != "pagerduty":
            return None
        channel_hash = hashlib.sha256(channel_id(channel).encode()).hexdigest()[:16]
        return Incident("close" if delivery.event == RECOVERED_EVENT else "open",
                        keys.webhook_incident(shard_of(delivery), channel_hash, delivery.signal.key))

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
        incident_shards = {}
        for channel in self._catalog().channels.values():
            if channel.format == "pagerduty":
                channel_hash = hashlib.sha256(channel_id(channel).encode()).hexdigest()[:16]
                incident_shards[channel_hash] = keys.webhook_shard(channel_key(channel.url))
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
        writes, self._writes = self._writes, Settlements()
        try:
            await self._outages.call(lambda: self._schedule.settle(writes))
        except Exception:
            log.exception("webhook schedule writes failed; those deliveries come back when their claims run out",
                          deliveries=len(writes))

    def _dispatch(self, pending: PendingDelivery) -> None:
        task = asyncio.create_task(self._deliver(pending))
        self._tasks[task] = pending.delivery
        task.add_done_callback(self._attempt_ended)

    def _attempt_ended(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
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
            response = await self._http.post(target.url, content=body, headers=headers,
                                             extensions=target.extensions, timeout=self._limits.timeout_s)
        except httpx.TimeoutException:
            return Attempt(at=at, outcome="failed", error="the receiver timed out"), None
        except httpx.TransportError as exc:
            return Attempt(at=at, outcome="failed", error=f"the receiver is unreachable ({type(exc).__name__})"), None
        status = response.status_code
        error = describe_status(status, response.content)
        if response.is_success:
            return Attempt(at=at, outcome="delivered", status=status), None
        if status == 410:
            return Attempt(at=at, outcome="gone", status=status, error=error), None
        if 400 <= status < 500 and status not in RETRY_STATUSES:
            return Attempt(at=at, outcome="rejected", status=status, error=error), None
        if response.is_redirect:
            error += " (redirects are not followed)"
        return (Attempt(at=at, outcome="failed", status=status, error=error),
                retry_after_seconds(response.headers.get("retry-after")))

    async def _disable_channel(self, channel: AlertChannel, reason: str) -> None:
        if await self._disable(channel_id(channel), reason):
            log.error("alert channel disabled", channel=channel_label(channel), reason=reason)
            self._events.channel_disabled(channel_label(channel))

    async def _dead_letter(self, pending: PendingDelivery, reason: str, error: str) -> None:
        ack = await self._send_dead_letter(reason, error, pending.delivery.model_dump(mode="json", by_alias=True),
                                           pending.attempts)
        await ack
        self._writes.finish(pending.delivery, "dead")

    async def _send_dead_letter(self, reason: str, error: str, delivery: Any,
                                attempts: tuple[Attempt, ...] = ()) -> Awaitable[Any]:
        log.warning("webhook delivery dead-lettered", reason=reason, error=error[:300])
        failed = FailedDelivery(reason=reason, error=error, delivery=delivery, attempts=attempts,
                                failed_at=datetime.now(UTC))
        ack: Awaitable[Any] = await self._producer.send(self._dlq_topic, value=failed.to_json())
        return ack

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

    def rebalance_listener(self) -> CommitOnRevoke:
        return self._committer.listener()
