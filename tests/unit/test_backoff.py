"""One backoff and one Retry-After reading for every retry: the wait doubles per attempt up to
its cap, jittered within its floor; Retry-After reads seconds or an HTTP date, never negative."""

from __future__ import annotations

import email.utils
import time

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from adapters.members import http
from adapters.members.http import RetryPolicy
from consumers import outage
from scoring.backoff import exponential, retry_after_seconds


def test_the_wait_doubles_per_attempt_up_to_its_cap_within_its_jitter() -> None:
    for attempt, ceiling in enumerate([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]):
        waits = [exponential(attempt, 0.1, 5.0, floor=0.5) for _ in range(200)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits), (attempt, min(waits), max(waits))
        assert max(waits) - min(waits) > ceiling / 10, "jittered, not one wait for every worker"
    full = [exponential(3, 0.25, 8.0) for _ in range(500)]
    assert min(full) < 0.2 and max(full) <= 2.0, "full jitter: anywhere from 0 to the ceiling"


async def test_the_outage_guard_waits_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(outage.asyncio, "sleep", no_wait)
    failures = 8

    async def step() -> str:
        nonlocal failures
        if failures:
            failures -= 1
            raise RedisConnectionError("down")
        return "up"

    assert await outage.OutageGuard(tolerance_s=60).call(step) == "up"
    ceilings = [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert len(waits) == 8 and all(c / 2 <= w <= c for w, c in zip(waits, ceilings, strict=True)), waits


def test_member_calls_wait_by_it(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, float, float]] = []

    def recorded(attempt: int, first_s: float, cap_s: float, floor: float = 0.0) -> float:
        asked.append((attempt, first_s, cap_s))
        return 0.0

    monkeypatch.setattr(http, "exponential", recorded)
    RetryPolicy(backoff_base_s=0.25, backoff_cap_s=8).backoff(3)
    assert asked == [(3, 0.25, 8)]


def test_a_retry_count_past_any_doubling_waits_the_cap() -> None:
    assert 2.5 <= exponential(5000, 0.1, 5.0, floor=0.5) <= 5.0


def test_retry_after_reads_seconds_or_a_date_and_never_goes_negative() -> None:
    assert retry_after_seconds("7") == 7.0 and retry_after_seconds(" 2.5 ") == 2.5
    assert retry_after_seconds("-3") == 0.0
    in_a_minute = email.utils.formatdate(time.time() + 60, usegmt=True)
    assert 55 <= (retry_after_seconds(in_a_minute) or 0) <= 61
    assert retry_after_seconds(email.utils.formatdate(time.time() - 600, usegmt=True)) == 0.0
    assert retry_after_seconds(None) is None and retry_after_seconds("") is None
    assert retry_after_seconds("soon, maybe") is None
