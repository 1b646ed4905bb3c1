"""When a failed webhook delivery is tried again: the schedule of waits (``SGW_WEBHOOK_RETRIES``),
jittered, and a receiver's ``Retry-After`` within a cap. Pure; the durable schedule that keeps
deliveries in Redis is ``adapters.stores.deliveries``."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_S = {"ms": 0.001, "s": 1, "m": 60, "h": 3_600, "d": 86_400}


def parse_duration(text: str) -> float:
    """'5s', '2m', '1h', '1.5d' as seconds; ValueError saying what is accepted."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text.strip()!r} is not a duration like 5s, 2m, 1h or 1d")
    return float(match[1]) * _UNIT_S[match[2]]


RETRY_AFTER_CAP_S = 3_600.0


@dataclass(frozen=True)
class RetrySchedule:
    """Waits after each failed attempt: ``delays_s[n]`` after the (n+1)-th failure, each
    spread by +-``jitter`` so receivers that come back are not hit by every retry at once."""

    delays_s: tuple[float, ...]
    jitter: float = 0.2

    @classmethod
    def parse(cls, text: str) -> RetrySchedule:
        delays = tuple(parse_duration(part) for part in text.split(",") if part.strip())
        if not delays:
            raise ValueError("needs at least one wait, e.g. 5s,30s,2m,10m,1h,4h,8h")
        return cls(delays)

    @property
    def attempts(self) -> int:
        return len(self.delays_s) + 1

    def wait(self, failed_attempts: int, retry_after_s: float | None = None) -> float | None:
        """Seconds until the next attempt after ``failed_attempts`` failures, or None when the
        schedule is exhausted. A receiver's Retry-After wins, capped at the longest wait (or an
        hour, when that is longer) so a receiver cannot park a delivery for ever."""
        if failed_attempts > len(self.delays_s):
            return None
        if retry_after_s is not None:
            return min(max(retry_after_s, 0.0), max(*self.delays_s, RETRY_AFTER_CAP_S))
        base = self.delays_s[failed_attempts - 1]
        return base * random.uniform(1 - self.jitter, 1 + self.jitter)

    def horizon_s(self) -> float:
        """The longest a delivery can stay pending (every wait at its jittered maximum)."""
        return sum(self.delays_s) * (1 + self.jitter)
