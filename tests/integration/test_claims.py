"""Dedupe and the judge budget, all or nothing, on the real Redis."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from scoring.stores.claims import ClaimRequest, Claims

pytestmark = pytest.mark.integration

NOW = 1_796_221_800.0


def req(unique: str, subject: str, calls: int, limit: int | None = 10, group: str = "g") -> ClaimRequest:
    return ClaimRequest(project_id=f"p-{unique}", group_id=group, subject_key=f"trace:{subject}",
                        judge_calls=calls, budget_limit=limit, budget_window_s=3600)


async def test_budget_is_reserved_all_or_nothing(redis: Redis, unique: str) -> None:
    claims = Claims(redis)
    # 3 judge members per trace against 10 calls: three groups fit, the fourth would need 12.
    results = await claims.claim_many([req(unique, f"t{i}", 3) for i in range(4)], now=NOW)
    assert [r.state for r in results] == ["claimed", "claimed", "claimed", "exhausted"]
    assert await claims.budget_used(f"p-{unique}", 3600, now=NOW) == 9, "no partial panel was reserved"
    # A group with one judge still fits in what is left.
    assert (await claims.claim_many([req(unique, "t9", 1)], now=NOW))[0].state == "claimed"
    # The next window starts again.
    assert (await claims.claim_many([req(unique, "t10", 3)], now=NOW + 3600))[0].state == "claimed"


async def test_concurrent_workers_never_overspend(redis_url: str, unique: str) -> None:
    workers = [Claims(Redis.from_url(redis_url)) for _ in range(4)]
    batches = await asyncio.gather(*[
        w.claim_many([req(unique, f"w{n}-t{i}", 3, limit=30) for i in range(10)], now=NOW)
        for n, w in enumerate(workers)])
    claimed = sum(r.state == "claimed" for batch in batches for r in batch)
    assert claimed == 10, "30 calls / 3 per group"
    assert await workers[0].budget_used(f"p-{unique}", 3600, now=NOW) == 30
    for w in workers:
        await w._redis.aclose()


async def test_a_done_pair_is_skipped_without_budget(redis: Redis, unique: str) -> None:
    claims = Claims(redis)
    r = req(unique, "t1", 2)
    assert (await claims.claim_many([r], now=NOW))[0].state == "claimed"
    await claims.mark_done([(r, "rating-1")])
    again = (await claims.claim_many([r], now=NOW))[0]
    assert (again.state, again.detail) == ("done", "done:rating-1")
    assert await claims.budget_used(f"p-{unique}", 3600, now=NOW) == 2, "the redelivery spent nothing"


async def test_a_live_lease_is_busy_and_an_expired_one_is_claimed_again(redis: Redis, unique: str) -> None:
    first = Claims(redis, lease_s=0.3)
    second = Claims(redis)
    r = req(unique, "t1", 1)
    assert (await first.claim_many([r], now=NOW))[0].state == "claimed"
    busy = (await second.claim_many([r], now=NOW))[0]
    assert busy.state == "busy" and busy.detail == f"lease:{first.owner}"
    await asyncio.sleep(0.4)  # the first worker died mid-score: its lease runs out
    assert (await second.claim_many([r], now=NOW))[0].state == "claimed"
    assert await second.budget_used(f"p-{unique}", 3600, now=NOW) == 2, "scoring again reserves again"


async def test_release_frees_only_our_own_lease(redis: Redis, unique: str) -> None:
    mine, theirs = Claims(redis), Claims(redis)
    r = req(unique, "t1", 0)
    await mine.claim_many([r], now=NOW)
    await theirs.release([r])
    assert (await theirs.claim_many([r], now=NOW))[0].state == "busy"
    await mine.release([r])
    assert (await theirs.claim_many([r], now=NOW))[0].state == "claimed"


async def test_exhausted_pair_stays_skipped_on_redelivery(redis: Redis, unique: str) -> None:
    claims = Claims(redis)
    r = req(unique, "t1", 5, limit=2)
    assert (await claims.claim_many([r], now=NOW))[0].state == "exhausted"
    assert (await claims.claim_many([r], now=NOW))[0].state == "skipped"


async def test_no_budget_configured_is_unlimited_but_counted(redis: Redis, unique: str) -> None:
    claims = Claims(redis)
    results = await claims.claim_many([req(unique, f"t{i}", 3, limit=None) for i in range(50)], now=NOW)
    assert all(r.state == "claimed" for r in results)
    assert await claims.budget_used(f"p-{unique}", 3600, now=NOW) == 150
