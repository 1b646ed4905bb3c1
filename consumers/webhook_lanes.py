"""Each alert channel's lane in the webhook sender, and the sender's limits.

A lane is a channel's share of the sender: a few attempts at a time (its slots), a circuit
breaker, and the pace of its recent attempts - so a slow or dead channel is given only the
deliveries it can start soon, and never holds up another channel (``consumers.webhooks``).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field

from scoring.models import AlertChannel
from scoring.webhooks.breaker import CircuitBreaker


def channel_label(channel: AlertChannel) -> str:
    """A metric and log label for a channel: its project (none for an operator's), the agent and
    a short hash of the URL (URLs may carry credentials). Two projects' channels to the same
    agent and URL are two channels (``adapters.stores.channels.channel_id``), so two labels."""
    label = f"{channel.agent_id}#{hashlib.sha256(channel.url.encode()).hexdigest()[:8]}"
    return label if channel.project_id is None else f"{channel.project_id}/{label}"


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
