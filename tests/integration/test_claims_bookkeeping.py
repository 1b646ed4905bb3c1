"""The claims' bookkeeping on the real Redis: done marks expire, released leases are gone,
the budget counter reads the current window."""

from __future__ import annotations

import time

import pytest
from redis.asyncio import Redis

from adapters.stores.claims import Claims, claim_hash
from scoring.claim_request import ClaimRequest, day_of

pytestmark = pytest.mark.integration

DAY = day_of(1_796_000_000)


def req(unique: str, subject: str, calls: int = 1) -> ClaimRequest:
    return ClaimRequest(project_id=f"pb-{unique}", group_id="g", subject_key=f"trace:{subject}",
                        judge_calls=calls, calls_cap=10, budget_window_s=3600, day=DAY)


async def test_a_done_mark_expires_after_its_ttl(redis: Redis, unique: str) -> None:
    claims = Claims(redis, done_ttl_s=100)
    r = req(unique, "t-1")
    await claims.claim_many([r])
    await claims.mark_done([(r, "rating-1")])
    assert await claims.stored(r) == "done:rating-1"
    assert 0 < await redis.ttl(claim_hash(r)) <= 100, "every key that grows with traffic has a TTL"


async def test_release_gives_up_only_this_workers_leases(redis: Redis, unique: str) -> None:
    mine, theirs = Claims(redis), Claims(redis)
    a, b = req(unique, "t-a"), req(unique, "t-b")
    await mine.claim_many([a])
    await theirs.claim_many([b])
    await mine.release([a, b])
    assert await mine.stored(a) == "", "my lease is gone: another worker need not wait for it"
    assert (await mine.stored(b)).startswith("lease:"), "another worker's lease stays"
    assert [c.state for c in await theirs.claim_many([a])] == ["claimed"]


async def test_budget_used_reads_the_current_window(redis: Redis, unique: str) -> None:
    claims = Claims(redis)
    assert await claims.budget_used(f"pb-{unique}", 3600) == 0, "nothing spent yet"
    await claims.claim_many([req(unique, "t-1", calls=3)])  # now, in the current window
    assert await claims.budget_used(f"pb-{unique}", 3600) == 3


async def test_a_lease_lasts_its_lease_time_and_a_budget_window_key_two_windows(redis: Redis, unique: str) -> None:
    claims = Claims(redis, lease_s=10)
    r = req(unique, "t-lease")
    await claims.claim_many([r])
    server_now_ms = int(time.time() * 1000)
    expires_ms = int((await claims.stored(r)).split(":")[1])
    assert 8_000 < expires_ms - server_now_ms <= 10_500, "the lease is the configured 10 s"
    budget_keys = [k async for k in redis.scan_iter(match=f"*budget*pb-{unique}*")]
    assert budget_keys, "the window's counter exists"
    ttls = [await redis.ttl(k) for k in budget_keys]
    assert all(3_600 < ttl <= 7_200 for ttl in ttls), f"kept two windows, then gone: {ttls}"


async def test_a_lease_expires_its_lease_time_after_the_servers_clock_at_the_claim(redis: Redis, unique: str) -> None:
    # A lease of over a day: a wrong length would be off by far more than the round trips between
    # the two readings of the server's clock that bracket the claim.
    claims = Claims(redis, lease_s=100_000)
    r = req(unique, "t-long-lease")

    async def server_ms() -> int:
        seconds, micros = await redis.time()
        return seconds * 1000 + micros // 1000

    before = await server_ms()
    await claims.claim_many([r])
    after = await server_ms()
    expires_ms = int((await claims.stored(r)).split(":")[1])
    assert before + 100_000_000 <= expires_ms <= after + 100_000_000
