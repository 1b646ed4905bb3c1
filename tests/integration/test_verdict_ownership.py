"""A verdict belongs to the pair that published it: two workers, one of which lost its lease while
its judge answered, both finish the same pair; the verdict cache keeps the verdict of the pair
whose done mark is kept (the first), never the other's - whichever of the two finishes first."""

from __future__ import annotations

import asyncio
import time

import pytest
from redis.asyncio import Redis

from adapters.stores.claims import Claims, claim_field, claim_hash
from adapters.stores.verdicts import Paid, VerdictStore
from scoring.claim_request import ClaimRequest, day_of
from scoring.verdict_cache import CachedVerdict, CachePolicy

pytestmark = pytest.mark.integration

LEASE_S = 0.3
RATING_ID = "rating-of-the-pair"  # a pair's rating id is the same whoever publishes it


def pair(unique: str) -> ClaimRequest:
    return ClaimRequest(project_id=f"p-{unique}", group_id="g", subject_key="trace:t-1", judge_calls=1,
                        calls_cap=None, budget_window_s=3600, day=day_of(time.time()))


async def two_workers_on_one_pair(redis: Redis, unique: str) -> tuple[ClaimRequest, Claims, Claims]:
    """``stalled`` claimed the pair and outlived its lease; ``taker`` claimed it after."""
    request = pair(unique)
    stalled, taker = Claims(redis, lease_s=LEASE_S), Claims(redis, lease_s=LEASE_S)
    assert (await stalled.claim_many([request]))[0].state == "claimed"
    assert (await taker.claim_many([request]))[0].state == "busy", "the lease holds while it runs"
    await asyncio.sleep(LEASE_S + 0.2)
    assert (await taker.claim_many([request]))[0].state == "claimed", "a lease run out is taken over"
    return request, stalled, taker


def paid(request: ClaimRequest, justification: str) -> list[tuple[ClaimRequest, Paid]]:
    return [(request, Paid(request.project_id, "the-call", CachedVerdict(7.0, justification, RATING_ID)))]


@pytest.mark.parametrize("first", ["taker", "stalled"])
async def test_the_cached_verdict_is_the_one_of_the_done_mark_kept(redis: Redis, unique: str, first: str) -> None:
    request, stalled, taker = await two_workers_on_one_pair(redis, unique)
    policy = CachePolicy()
    workers = {"taker": taker, "stalled": stalled}
    second = "stalled" if first == "taker" else "taker"

    kept_first = await workers[first].mark_done([(request, RATING_ID)], paid=paid(request, f"by {first}"),
                                                cache=policy, batch=f"{first}-{unique}")
    kept_second = await workers[second].mark_done([(request, RATING_ID)], paid=paid(request, f"by {second}"),
                                                  cache=policy, batch=f"{second}-{unique}")

    assert (kept_first, kept_second) == (1, 0), "only the first done mark keeps its verdict"
    found = await VerdictStore(redis, policy).lookup(request.project_id, ["the-call"])
    assert found["the-call"].justification == f"by {first}"
    assert await redis.hget(claim_hash(request), claim_field(request)) == f"done:{RATING_ID}".encode()


async def test_a_done_mark_over_another_workers_lease_keeps_its_verdict_and_ends_that_lease(
        redis: Redis, unique: str) -> None:
    request, stalled, taker = await two_workers_on_one_pair(redis, unique)
    policy = CachePolicy()
    # The stalled worker had confirmed its lease and published: its done mark ends the taker's
    # lease, so the taker's confirmation fails and it never publishes a second value.
    assert await stalled.mark_done([(request, RATING_ID)], paid=paid(request, "by stalled"), cache=policy) == 1
    assert await taker.confirm([request]) == [False]
    found = await VerdictStore(redis, policy).lookup(request.project_id, ["the-call"])
    assert found["the-call"].justification == "by stalled"


async def test_a_verdict_of_a_pair_not_marked_in_the_batch_is_not_kept(redis: Redis, unique: str) -> None:
    request = pair(unique)
    other = ClaimRequest(project_id=request.project_id, group_id="g", subject_key="trace:t-2", judge_calls=1,
                         calls_cap=None, budget_window_s=3600, day=request.day)
    claims = Claims(redis)
    await claims.claim_many([request, other])
    assert await claims.mark_done([(request, RATING_ID)], paid=paid(other, "not this batch's"),
                                  cache=CachePolicy()) == 0
    assert await VerdictStore(redis, CachePolicy()).lookup(request.project_id, ["the-call"]) == {}
