"""Ratings history and session verdicts on the real Redis."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from adapters.stores import keys
from adapters.stores.ratings import RatingsStore, SessionVerdict
from scoring.results import HistoryEntry

pytestmark = pytest.mark.integration

NOW = 1_796_221_800.0  # half past an hour: the three recent events share one hourly bucket


async def test_history_buckets_count_mean_min_max_below_and_no_score(redis: Redis, unique: str) -> None:
    store = RatingsStore(redis)
    group = f"g-{unique}"
    events = [HistoryEntry(group, 8.0, False, NOW - 30), HistoryEntry(group, 4.0, True, NOW - 20),
              HistoryEntry(group, None, False, NOW - 10), HistoryEntry(group, 6.0, False, NOW - 3 * 3600),
              HistoryEntry(f"other-{unique}", 1.0, True, NOW)]
    await store.write(events)

    week = await store.history(group, "7d", now=NOW)
    assert week.bucket_seconds == 3600 and len(week.buckets) == 168
    assert (week.count, week.scored, week.below, week.no_score) == (4, 3, 1, 1)
    assert week.mean == pytest.approx(6.0)
    last = week.buckets[-1]
    assert (last.count, last.min, last.max, last.mean, last.no_score) == (3, 4.0, 8.0, 6.0, 1)

    hour = await store.history(group, "1h", now=NOW)
    assert (hour.count, hour.scored, hour.no_score) == (3, 2, 1), "the 3-hour-old event is outside 1h"
    assert hour.bucket_seconds == 60 and len(hour.buckets) == 60
    assert {b.min for b in hour.buckets if b.scored} <= {4.0, 8.0}

    assert (await store.history(group, "30d", now=NOW)).count == 4
    assert (await store.history(group, "24h", now=NOW)).count == 4
    with pytest.raises(ValueError, match="window must be one of 1h, 24h, 7d, 30d"):
        await store.history(group, "2w")


async def test_pairs_skipped_for_budget_are_counted_beside_no_score_and_are_not_results(
        redis: Redis, unique: str) -> None:
    store = RatingsStore(redis)
    group = f"g-{unique}"
    await store.write([HistoryEntry(group, None, False, NOW - 10)])
    await store.write_counts(NOW - 5, skipped={group: 3, f"other-{unique}": 1})
    await store.write_counts(NOW - 3 * 3600, skipped={group: 2})
    await store.write_counts(NOW)  # nothing to count: no call
    hour = await store.history(group, "1h", now=NOW)
    assert (hour.count, hour.no_score, hour.skipped) == (1, 1, 3), "skips are not results"
    assert (await store.history(group, "7d", now=NOW)).skipped == 5
    wire = hour.wire()
    assert wire["skipped"] == 3 and sum(b["skipped"] for b in wire["buckets"]) == 3  # what ratings() answers


async def test_traces_matched_by_the_filter_are_counted_apart_from_results(redis: Redis, unique: str) -> None:
    store = RatingsStore(redis)
    group = f"g-{unique}"
    await store.write([HistoryEntry(group, 7.0, False, NOW - 10)])
    await store.write_counts(NOW - 5, matched={group: 40}, skipped={group: 1})
    await store.write_counts(NOW - 4, matched={group: 2})
    hour = await store.history(group, "1h", now=NOW)
    assert (hour.count, hour.scored, hour.skipped, hour.matched) == (1, 1, 1, 42)
    assert hour.mean == 7.0, "a matched count is not a result: the mean is the scored results'"
    wire = hour.wire()
    assert wire["matched"] == 42 and sum(b["matched"] for b in wire["buckets"]) == 42


async def test_buckets_expire_after_their_window(redis: Redis, unique: str) -> None:
    store = RatingsStore(redis)
    group = f"g-{unique}"
    await store.write([HistoryEntry(group, 5.0, False, NOW)])
    for window_s, bucket_s in keys.RATING_WINDOWS.values():
        key = keys.rating_bucket(group, bucket_s, int(NOW) // bucket_s * bucket_s)
        ttl = await redis.ttl(key)
        assert 0 < ttl <= window_s + bucket_s
    # The expiry is set when a bucket is created, not renewed by each write (a command a bucket
    # and batch saved): the bucket's first write is never before its start, so it outlives its window.
    key = keys.rating_bucket(group, 60, int(NOW) // 60 * 60)
    await redis.expire(key, 100)
    await store.write([HistoryEntry(group, 6.0, False, NOW + 1)])
    assert 0 < await redis.ttl(key) <= 100 and int(await redis.hget(key, "count")) == 2


async def test_session_scores_keep_the_latest_verdict_per_group(redis: Redis, unique: str) -> None:
    store = RatingsStore(redis)
    session = f"s-{unique}"
    await store.write([], [SessionVerdict(session, "g-a", 3.0, "Weighted blend: first", NOW)])
    await store.write([], [SessionVerdict(session, "g-a", 4.5, "Weighted blend: second", NOW + 60),
                            SessionVerdict(session, "g-b", None, "Weighted blend: no score", NOW + 60)])
    scores = await store.session_scores(session)
    assert [(s["kind"], s["rating"], s["justification"]) for s in scores] == [
        ("scorer-group:g-a", 4.5, "Weighted blend: second"),
        ("scorer-group:g-b", None, "Weighted blend: no score")]
    assert await store.session_scores(f"none-{unique}") == []


async def test_the_judge_call_index_never_outlives_the_list_whoever_trimmed_it(redis: Redis, unique: str) -> None:
    from adapters.stores import keys
    from adapters.stores.ratings import RatingsStore

    group, store = f"calls-{unique}", RatingsStore(redis)

    def entry(n: int) -> HistoryEntry:
        return HistoryEntry(group, 7.0, False, NOW, b'{"id":"r-%d"}' % n, rating_id=f"r-{n}", calls=b'[{"n":%d}]' % n)

    await store.write([entry(n) for n in range(keys.RESULTS_KEPT)])
    assert await store.result(group, "r-0") == (b'{"id":"r-0"}', b'[{"n":0}]')
    # An older version's worker (0.2 kept no index) pushes and trims 600 results of its own.
    head = int((await redis.lindex(keys.group_results(group), 0)).split(b":", 1)[0])
    await redis.lpush(keys.group_results(group), *[f"{head + 1 + n}:0:{{\"id\":\"old-{n}\"}}" for n in range(600)])
    await redis.ltrim(keys.group_results(group), 0, keys.RESULTS_KEPT - 1)
    # Until a push carries the seq past a multiple of RESULTS_INDEX_TRIM_EVERY, the index holds
    # entries of results gone from the list - each no longer found; that push trims them.
    pushes = keys.RESULTS_INDEX_TRIM_EVERY - (head + 600) % keys.RESULTS_INDEX_TRIM_EVERY
    await store.write([entry(5_000 + n) for n in range(pushes - 1)])
    assert await redis.zcard(keys.group_results_seqs(group)) == keys.RESULTS_KEPT + pushes - 1
    assert await store.result(group, "r-0") is None, "its result is gone from the list"
    await store.write([entry(5_000 + pushes)])
    oldest = 600 + pushes  # r-n has seq n + 1; the list keeps the last RESULTS_KEPT seqs
    assert await redis.zcard(keys.group_results_seqs(group)) == keys.RESULTS_KEPT - oldest + pushes
    assert await redis.hlen(keys.group_judge_calls(group)) == await redis.zcard(keys.group_results_seqs(group))
    assert await store.result(group, f"r-{oldest - 1}") is None and await store.result(group, f"r-{oldest}") is not None
    # Recorded again (a redelivery): trimming its older copy keeps the newer one's calls.
    await store.write([entry(700)])
    await store.write([entry(9_000 + n) for n in range(100)])  # the older r-700 falls off
    assert await store.result(group, "r-700") == (b'{"id":"r-700"}', b'[{"n":700}]')
    # A list begun again (expired, deleted) begins its index again.
    await redis.delete(keys.group_results(group))
    await store.write([entry(1)])
    assert await redis.zcard(keys.group_results_seqs(group)) == 1 and await store.result(group, "r-900") is None
