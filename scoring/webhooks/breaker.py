"""A circuit breaker per alert channel: stop hammering a receiver that keeps failing.

closed     every attempt goes; ``failures`` failures in a row open it.
open       nothing goes until ``retry_at``; the first caller after that gets the half-open probe.
half_open  one probe is in flight; its success closes the breaker, its failure opens it again
           for twice as long (up to ``max_open_s``).

The breaker also knows how long the channel has been failing without a single success
(``failing_for``), which is what decides that a channel is marked disabled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]
STATE_VALUES: dict[BreakerState, int] = {"closed": 0, "half_open": 1, "open": 2}


@dataclass
class CircuitBreaker:
    failures: int = 5  # failures in a row that open the breaker
    open_s: float = 30.0  # first pause; doubles on every failed probe
    max_open_s: float = 600.0
    state: BreakerState = "closed"
    retry_at: float = 0.0
    _in_a_row: int = 0
    _pause_s: float = 0.0
    _failing_since: float | None = None
    _probe_out: bool = field(default=False, repr=False)

    def allows(self, now: float) -> bool:
        """May an attempt start now? In half-open state only the single probe may."""
        if self.state == "closed":
            return True
        if self.state == "open" and now >= self.retry_at:
            self.state = "half_open"
            self._probe_out = False
        if self.state == "half_open" and not self._probe_out:
            self._probe_out = True
            return True
        return False

    def next_try(self, now: float) -> float:
        """When an attempt that was not allowed should be tried again."""
        return max(self.retry_at, now + 1.0)

    def succeeded(self) -> None:
        self.state, self._in_a_row, self._pause_s, self._failing_since = "closed", 0, 0.0, None
        self._probe_out = False

    def failed(self, now: float) -> None:
        if self._failing_since is None:
            self._failing_since = now
        self._in_a_row += 1
        if self.state == "half_open" or (self.state == "closed" and self._in_a_row >= self.failures):
            self._pause_s = min(self.max_open_s, self._pause_s * 2 if self._pause_s else self.open_s)
            self.state, self.retry_at, self._probe_out = "open", now + self._pause_s, False

    def failing_for(self, now: float) -> float:
        """Seconds since the first failure with no success after it (0 when healthy)."""
        return 0.0 if self._failing_since is None else now - self._failing_since
