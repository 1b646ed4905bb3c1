"""The retry schedule's waits and the per-channel circuit breaker."""

from __future__ import annotations

import pytest

from scoring.webhooks.breaker import CircuitBreaker
from scoring.webhooks.retries import RETRY_AFTER_CAP_S, RetrySchedule, parse_duration


def test_the_default_schedule_parses_into_growing_waits() -> None:
    schedule = RetrySchedule.parse("5s,30s,2m,10m,1h,4h,8h")
    assert schedule.delays_s == (5, 30, 120, 600, 3600, 14400, 28800) and schedule.attempts == 8
    for failed, base in enumerate(schedule.delays_s, start=1):
        for _ in range(20):
            wait = schedule.wait(failed)
            assert wait is not None and base * 0.8 <= wait <= base * 1.2, "jitter stays within 20%"
    assert schedule.wait(8) is None, "after the last wait the schedule is exhausted"


def test_retry_after_wins_but_is_capped() -> None:
    schedule = RetrySchedule.parse("1s,1s")
    assert schedule.wait(1, retry_after_s=7) == 7
    assert schedule.wait(1, retry_after_s=10**9) == RETRY_AFTER_CAP_S
    assert schedule.wait(3, retry_after_s=7) is None, "Retry-After does not extend an exhausted schedule"


@pytest.mark.parametrize("bad", ["", "5", "5 parsecs", "-1s", "1s,,x"])
def test_a_bad_schedule_is_refused_saying_what_is_accepted(bad: str) -> None:
    with pytest.raises(ValueError):
        RetrySchedule.parse(bad)
    assert parse_duration("250ms") == 0.25 and parse_duration("1.5d") == 1.5 * 86400


def test_the_breaker_opens_after_failures_in_a_row_and_probes_once_half_open() -> None:
    b = CircuitBreaker(failures=3, open_s=10)
    for t in (0, 1):
        assert b.allows(t)
        b.failed(t)
    assert b.state == "closed"
    b.failed(2)
    assert b.state == "open" and not b.allows(5) and b.next_try(5) == 12
    assert b.allows(12) and b.state == "half_open", "the first caller after the pause probes"
    assert not b.allows(12.1), "only one probe at a time"
    b.failed(13)
    assert b.state == "open" and b.retry_at == 13 + 20, "a failed probe doubles the pause"
    assert b.failing_for(13) == 13
    assert b.allows(33)
    b.succeeded()
    assert b.state == "closed" and b.allows(34) and b.failing_for(34) == 0
