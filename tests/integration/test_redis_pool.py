"""The process's Redis pool against the real server: bounded, a call past the bound waits for a
connection (counted, with its seconds) rather than failing, and a wait past the deadline is
``PoolBusy`` - back-pressure, which the outage guard retries without reporting an outage."""

from __future__ import annotations

import asyncio

import pytest

from adapters.stores.client import PoolBusy
from consumers.outage import OutageGuard, outage_of
from worker import metrics
from worker.connections import redis_client
from worker.settings import Settings

pytestmark = pytest.mark.integration


def gauge(state: str) -> float:
    return float(metrics.REGISTRY.get_sample_value("sgw_redis_connections", {"state": state}) or 0)


def waits(outcome: str) -> float:
    return float(metrics.REGISTRY.get_sample_value("sgw_redis_connection_waits_total", {"outcome": outcome}) or 0)


async def test_a_call_past_the_bound_waits_for_a_connection_and_is_counted(redis_db_url: str) -> None:
    redis = redis_client(Settings(redis_url=redis_db_url, redis_max_connections=8, redis_timeout_s=5))
    for outcome in ("got", "deadline"):  # exported from the start (a dashboard's rate is never empty)
        assert metrics.REGISTRY.get_sample_value("sgw_redis_connection_waits_total", {"outcome": outcome}) is not None
    got_before, seconds_before = waits("got"), metrics.REDIS_CONNECTION_WAIT_SECONDS._value.get()
    try:
        # Every connection held (as a pipeline or a long command would) for 0.3 s; 8 calls meanwhile.
        pool = redis.connection_pool
        held = [await pool.get_connection() for _ in range(8)]
        assert gauge("in_use") == 8 and gauge("open") == 8 and gauge("most") == 8
        calls = asyncio.gather(*(redis.ping() for _ in range(8)))
        await asyncio.sleep(0.3)
        for connection in held:
            await pool.release(connection)
        assert await calls == [True] * 8
    finally:
        await redis.aclose()
    assert waits("got") - got_before == 8, "each call that found the pool full waited, and was counted"
    assert metrics.REDIS_CONNECTION_WAIT_SECONDS._value.get() - seconds_before >= 8 * 0.1


async def test_a_wait_past_the_deadline_is_pool_busy_and_no_outage(redis_db_url: str) -> None:
    redis = redis_client(Settings(redis_url=redis_db_url, redis_max_connections=8, redis_timeout_s=0.4))
    deadline_before = waits("deadline")
    changes: list[tuple[str, bool]] = []

    class Changes:
        def outage(self, dependency: str, unreachable: bool) -> None:
            changes.append((dependency, unreachable))

    try:
        pool = redis.connection_pool
        held = [await pool.get_connection() for _ in range(8)]
        with pytest.raises(PoolBusy, match="8 Redis connections") as caught:
            await redis.ping()
        assert outage_of(caught.value) is None

        async def free_later() -> None:
            await asyncio.sleep(1.0)
            for connection in held:
                await pool.release(connection)

        # Through the guard, the step runs again once a connection is free: no outage reported.
        freed = asyncio.create_task(free_later())
        assert await OutageGuard(tolerance_s=30, events=Changes()).call(redis.ping) is True
        await freed
    finally:
        await redis.aclose()
    assert waits("deadline") - deadline_before >= 2
    assert changes == []
