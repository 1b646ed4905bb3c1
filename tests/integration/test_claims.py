"""Dedupe and the judge budget, all or nothing, on the real Redis."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from adapters.stores.claims import ClaimResult, Claims, claim_hash
from devtools.redis_servers import LocalRedis
from scoring.claim_request import ClaimRequest, day_of
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

NOW = 1_796_221_800.0


def req(unique: str, subject: str, calls: int, limit: int | None = 10, group: str = "g",
        day: int = day_of(NOW)) -> ClaimRequest:
    return ClaimRequest(project_id=f"p-{unique}", group_id=group, subject_key=f"trace:{subject}",
                        judge_calls=calls, calls_cap=limit, budget_window_s=3600, day=day)


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
    workers = [Claims(connect(redis_url)) for _ in range(4)]
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
    assert busy.state == "busy" and busy.detail.startswith("lease:") and busy.detail.endswith(f":{first.owner}")
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


async def test_a_pair_twice_in_one_batch_is_claimed_once(redis: Redis, unique: str) -> None:
    claims = Claims(redis)
    r = req(unique, "t1", 2)
    states = [c.state for c in await claims.claim_many([r, req(unique, "t2", 2), r], now=NOW)]
    assert states == ["claimed", "claimed", "busy"], "the second copy sees the first one's lease"
    assert await claims.budget_used(f"p-{unique}", 3600, now=NOW) == 4, "reserved once per pair"


async def test_budget_runs_out_in_batch_order_within_one_call(redis: Redis, unique: str) -> None:
    claims = Claims(redis)
    batch = [req(unique, "t1", 4, limit=7), req(unique, "t2", 4, limit=7), req(unique, "t3", 3, limit=7)]
    states = [c.state for c in await claims.claim_many(batch, now=NOW)]
    assert states == ["claimed", "exhausted", "claimed"], "4 fit, 4 more do not, 3 more do"
    assert await claims.budget_used(f"p-{unique}", 3600, now=NOW) == 7


async def test_projects_in_one_batch_keep_their_own_budgets(redis: Redis, unique: str) -> None:
    claims = Claims(redis)
    other = ClaimRequest(project_id=f"q-{unique}", group_id="g", subject_key="trace:t1", judge_calls=3,
                         calls_cap=3, budget_window_s=3600, day=day_of(NOW))
    states = [c.state for c in await claims.claim_many(
        [req(unique, "t1", 3, limit=3), other, req(unique, "t2", 3, limit=3)], now=NOW)]
    assert states == ["claimed", "claimed", "exhausted"]
    assert await claims.budget_used(f"q-{unique}", 3600, now=NOW) == 3


async def test_a_large_batch_costs_a_handful_of_commands(own_redis: LocalRedis, unique: str) -> None:
    """Claims are kept per project and day: a batch of thousands of pairs is read and written
    with a few commands, not a few per pair (commands run inside scripts count). On a server of
    its own: the count is the server's, and no other client may add to it."""
    redis = Redis.from_url(own_redis.url)

    async def commands() -> int:
        stats = await redis.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")

    claims = Claims(redis)
    batch = [req(unique, f"t{i}", 1, limit=None, day=day_of(NOW) - (i % 2)) for i in range(9_000)]
    await claims.claim_many(batch[:1], now=NOW)  # the scripts are loaded: not counted below
    await claims.mark_done([(req(unique, "warm", 1), "rating-0")])
    before = await commands()
    results = await claims.claim_many(batch, now=NOW)
    held = await claims.confirm(batch)  # before publishing: the lease is still ours
    await claims.release(batch[:4_500])  # e.g. a shutdown with half of them unpublished
    released = await claims.claim_many(batch[:4_500], now=NOW)
    await claims.mark_done([(r, f"rating-{i}") for i, r in enumerate(batch)])
    spent = await commands() - before
    assert [c.state for c in results] == ["busy"] + ["claimed"] * 8_999
    assert held == [True] * 9_000, "the first pair, claimed by the loading call, is ours too"
    assert {c.state for c in released} == {"claimed"}, "released leases are free to claim again"
    # About 70: the claim script's chunks of 4,000 pairs, the done marks' HMGETs and HSETs of
    # 2,000 fields (a done mark is written only over no done mark: the first wins).
    assert spent <= 76, f"{spent} commands for 9,000 pairs over two days (past the scripts' chunks)"
    again = await claims.claim_many(batch, now=NOW)
    assert {c.state for c in again} == {"done"}, "every pair is done after its mark"
    assert again[7].detail == "done:rating-7"
    await redis.aclose()


async def test_the_same_subject_on_another_day_is_another_pair(redis: Redis, unique: str) -> None:
    # A claim is kept under the subject's own day (a trace's timestamp): a trace re-sent with
    # another day's timestamp is scored again (under the same rating id).
    claims = Claims(redis)
    r = req(unique, "t1", 0)
    await claims.claim_many([r], now=NOW)
    await claims.mark_done([(r, "rating-1")])
    assert (await claims.claim_many([r], now=NOW))[0].state == "done"
    assert (await claims.claim_many([req(unique, "t1", 0, day=r.day + 1)], now=NOW))[0].state == "claimed"


async def test_confirm_holds_only_this_workers_own_lease_and_renews_it(redis: Redis, unique: str) -> None:
    mine, theirs = Claims(redis, lease_s=0.3), Claims(redis)
    kept, lapsed, taken, done = (req(unique, f"t{i}", 0) for i in range(4))
    await mine.claim_many([kept, lapsed, taken, done], now=NOW)
    await asyncio.sleep(0.4)  # every lease of ours has run out
    assert (await theirs.claim_many([taken], now=NOW))[0].state == "claimed", "another worker took this one"
    await theirs.mark_done([(done, "rating-theirs")])
    assert await mine.confirm([kept, taken, done]) == [True, False, False], \
        "a lapsed lease no one took is still ours; a taken or done pair is not"
    assert (await theirs.claim_many([kept], now=NOW))[0].state == "busy", "confirming renewed the lease"
    assert await mine.confirm([lapsed, kept]) == [True, True]
    assert await theirs.stored(done) == "done:rating-theirs", "a confirm never touches another's pair"


async def test_a_tenants_extreme_timestamps_keep_its_claims_in_its_own_project(redis: Redis, unique: str) -> None:
    # A trace's timestamp is the tenant's to set: the far past or future only picks the day its
    # claim is kept under, inside its own project's keys, with the usual TTL.
    claims = Claims(redis)
    days = [day_of(datetime(1, 1, 1, tzinfo=UTC).timestamp()), day_of(datetime(9999, 12, 31, tzinfo=UTC).timestamp())]
    batch = [req(unique, "t-extreme", 0, day=d) for d in days]
    assert [c.state for c in await claims.claim_many(batch, now=NOW)] == ["claimed", "claimed"]
    for r in batch:
        assert f"{{p-{unique}}}" in claim_hash(r), "under the project's own hash tag"
        assert 0 < await redis.ttl(claim_hash(r)), "kept with a TTL like any other day"


def test_a_subject_is_kept_under_its_own_utc_day_before_1970_too() -> None:
    # The day is floored, not cut toward zero: the last second of 31 Dec 1969 is day -1.
    for midnight in (datetime(1969, 12, 31, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)):
        first, last = midnight.timestamp(), (midnight + timedelta(days=1)).timestamp() - 1
        assert day_of(first) == day_of(last) == day_of(last + 1) - 1, midnight
    assert day_of(datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()) == -1


async def test_claims_work_on_a_client_that_decodes_replies(redis_url: str, unique: str) -> None:
    redis = connect(redis_url, decode_responses=True)
    try:
        claims = Claims(redis)
        r = req(unique, "t1", 1)
        assert await claims.claim_many([r], now=NOW) == [ClaimResult(state="claimed", detail="", calls=1)]
        await claims.mark_done([(r, "rating-1")])
        assert await claims.claim_many([r], now=NOW) == [ClaimResult(state="done", detail="done:rating-1")]
        assert await claims.stored(r) == "done:rating-1"
    finally:
        await redis.aclose()


async def test_a_batch_over_several_projects_is_never_one_transaction(own_redis: LocalRedis, unique: str) -> None:
    """On Redis Cluster a batch's projects lie in several hash slots, which one MULTI cannot
    span: claims, confirmations, releases and done marks are pipelined without MULTI/EXEC. On a
    server of its own: no other client's transaction is counted."""
    redis = Redis.from_url(own_redis.url)
    try:
        claims = Claims(redis)
        other = ClaimRequest(project_id=f"q-{unique}", group_id="g", subject_key="trace:t1", judge_calls=1,
                             calls_cap=10, budget_window_s=3600, day=day_of(NOW))
        batch = [req(unique, "t1", 1), other]
        assert [c.state for c in await claims.claim_many(batch, now=NOW)] == ["claimed", "claimed"]
        assert await claims.confirm(batch) == [True, True]
        await claims.release(batch[:1])
        await claims.mark_done([(other, "rating-1")])
        assert [await claims.stored(r) for r in batch] == ["", "done:rating-1"]
        stats = await redis.info("commandstats")
        assert "cmdstat_multi" not in stats and "cmdstat_exec" not in stats, sorted(stats)
    finally:
        await redis.aclose()


async def test_scripts_run_by_sha_alone_and_a_server_that_forgot_them_runs_them_once(
        redis: Redis, unique: str) -> None:
    """No SCRIPT EXISTS before each pipeline (a command and a round trip per batch): a script goes
    by its SHA; after SCRIPT FLUSH (a restarted or failed-over server) the NOSCRIPT answer ran
    nothing, and the command runs again with the script loaded - once, not twice."""
    claims = Claims(redis)
    await claims.claim_many([req(unique, "warm", 0)], now=NOW)  # loaded
    before = await redis.info("commandstats")
    await claims.claim_many([req(unique, "t1", 2)], now=NOW)
    after = await redis.info("commandstats")
    assert after.get("cmdstat_script|exists", {}).get("calls", 0) == \
        before.get("cmdstat_script|exists", {}).get("calls", 0), "no SCRIPT EXISTS asked"
    await redis.script_flush()
    results = await claims.claim_many([req(unique, "t2", 3), req(unique, "t1", 2)], now=NOW)
    assert [r.state for r in results] == ["claimed", "busy"]
    assert await claims.budget_used(f"p-{unique}", 3600, now=NOW) == 5, "the re-run reserved once"
