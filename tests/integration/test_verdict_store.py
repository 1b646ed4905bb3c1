"""The verdict cache in Redis: a project's verdicts are bounded in count (a share per
time bucket) and size, kept a TTL, read back whole, and are read by the claim beside the budget - a
pair reserves calls for its misses only, a key an earlier pair of the batch pays for is not
reserved twice, and a refused pair pays for nothing."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from adapters.stores import keys
from adapters.stores.claims import Claims
from adapters.stores.verdicts import Paid, VerdictStore
from scoring.claim_request import ClaimRequest, day_of
from scoring.verdict_cache import MAX_ENTRY_BYTES, CachedVerdict, CachePolicy


def verdict(n: int, justification: str = "fine") -> CachedVerdict:
    return CachedVerdict(float(n % 11), justification, f"r-{n}")


async def test_a_project_keeps_at_most_its_share_in_each_bucket_and_each_bucket_a_ttl(
        redis: Redis, unique: str) -> None:
    project, other = f"p-{unique}", f"q-{unique}"
    policy = CachePolicy(ttl_s=600, max_entries=100)  # buckets of 200 s, 25 verdicts each, 4 read
    store, now = VerdictStore(redis, policy), float(int(time.time()) // 200 * 200)
    kept = await store.store([Paid(project, f"k{n}", verdict(n)) for n in range(40)], now=now)
    assert kept == [f"k{n}" for n in range(25)], "the bucket's room, first come first kept"
    await store.store([Paid(other, "k0", verdict(99))], now=now)
    later = now + policy.bucket_s
    assert await store.store([Paid(project, f"k{n}", verdict(n)) for n in range(25, 40)], now=later) == \
        [f"k{n}" for n in range(25, 40)], "the next bucket takes what the full one could not"
    assert await store.entries(project, now=later) == 40
    found = await store.lookup(project, [f"k{n}" for n in range(50)], now=later)
    assert sorted(found, key=lambda k: int(k[1:])) == [f"k{n}" for n in range(40)] and found["k39"] == verdict(39)
    assert await store.lookup(other, ["k0", "k1"], now=later) == {"k0": verdict(99)}, "another project's are its own"
    first_bucket = keys.judge_verdicts(project, int(now) // policy.bucket_s)
    assert await redis.pexpiretime(first_bucket) == (int(now) // policy.bucket_s + 4) * policy.bucket_s * 1000
    assert await store.lookup(project, ["k0"], now=now + policy.ttl_s) != {}, "kept its TTL at least"
    assert await store.lookup(project, ["k0"], now=now + 4 * policy.bucket_s) == {}, "no longer read past it"


async def test_an_entry_too_large_is_not_kept(redis: Redis, unique: str) -> None:
    store = VerdictStore(redis, CachePolicy())
    kept = await store.store([Paid(f"p-{unique}", "big", verdict(1, "x" * MAX_ENTRY_BYTES)),
                              Paid(f"p-{unique}", "small", verdict(2))])
    assert kept == ["small"]
    assert list(await store.lookup(f"p-{unique}", ["big", "small"])) == ["small"]


def request(project: str, subject: str, calls: int, limit: int) -> ClaimRequest:
    return ClaimRequest(project_id=project, group_id="g", subject_key=f"trace:{subject}", judge_calls=calls,
                        calls_cap=limit, budget_window_s=3600, day=day_of(time.time()))


async def test_the_claim_reserves_only_what_no_verdict_or_earlier_pair_pays_for(redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    await VerdictStore(redis, CachePolicy()).store([Paid(project, "paid", verdict(7))])
    claims = Claims(redis)
    pairs = [request(project, f"t{n}", 2, limit=3) for n in range(4)]
    lookups = [[("paid", 0), ("new", 0)],  # a hit and a miss: reserves 1, pays for "new"
               [("paid", 0), ("new", 0)],  # both paid for (the first pair pays "new"): reserves 0
               [("other", 0), ("more", 0)],  # two misses: 2 more would make 3 - fits
               [("last", 0), ("paid", 0)]]  # one miss: 4 > 3, refused - and pays for nothing
    results = await claims.claim_many(pairs, lookups=lookups, verdict_buckets=CachePolicy().reading(time.time()))
    assert [(r.state, r.leads) for r in results] == [("claimed", ("new",)), ("claimed", ()),
                                                     ("claimed", ("other", "more")), ("exhausted", ())]
    assert [dict(r.cached) for r in results[:2]] == [{"paid": verdict(7).encode()}] * 2
    assert await claims.budget_used(project, 3600) == 3, "1 + 0 + 2 reserved, never the refused pair's"
