"""Money and counters exact through a connection lost mid-pipeline, on a real
Redis behind a loopback proxy that cuts the connection at a chosen byte of the finish's pipeline.

The finish writes a batch as ``PairProtocol._finish`` does - the ratings history (counts, spend)
of its groups, then the done marks, settlements (tokens, money) and savings of its projects -
through the outage guard, which replays the whole write after the cut. Swept across the
pipeline's bytes: wherever the cut lands (before any script ran, between two projects' scripts,
inside the last one), every project's tokens, money and savings and every group's
counts and spend equal the batch's own sums, exactly. Without the batch id checked in each
adding script, a cut after some scripts ran counted their part twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from urllib.parse import urlparse

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from adapters.stores.claims import Claims, Settlement
from adapters.stores.ratings import RatingsStore
from consumers.outage import OutageGuard
from scoring.claim_request import ClaimRequest, day_of
from scoring.prices import Rates
from scoring.results import HistoryEntry
from tests.support.cutting_proxy import CuttingProxy
from worker.connections import redis_client
from worker.settings import Settings

pytestmark = pytest.mark.integration

PROJECTS, PAIRS = 3, 4  # pairs per project, each of its own group: 3 project scripts, 3 group scripts
POINTS = 14  # cut positions swept across the pipeline


def _batch(tag: str) -> tuple[list[HistoryEntry], list[tuple[ClaimRequest, str]], list[Settlement],
                              list[tuple[ClaimRequest, int, int]]]:
    now, day = time.time(), day_of(time.time())
    entries, done, settled, saved = [], [], [], []
    for p in range(PROJECTS):
        for i in range(PAIRS):
            request = ClaimRequest(f"p-{tag}-{p}", f"g-{tag}-{p}", f"trace:t{i}", 1, 100, judge_tokens=500,
                                   tokens_cap=10_000, rates=Rates(per_token=1_000, per_call=1_000), cost_cap=10**12, day=day)
            entries.append(HistoryEntry(request.group_id, 4.0 + i, False, now, document=b'{"doc": %d}' % i,
                                        rating_id=f"r-{tag}-{p}-{i}", costs=(("j", 1_000 + i),), judge_calls=1,
                                        tokens=100 + i))
            done.append((request, f"r-{tag}-{p}-{i}"))
            settled.append(Settlement(request, now, tokens=100 + i, cost=1_000 + i))
            saved.append((request, 1, 10 + i))
    return entries, done, settled, saved


def _finish(redis: Redis, tag: str) -> Callable[[], Awaitable[None]]:
    entries, done, settled, saved = _batch(tag)
    batch = uuid.uuid4().hex  # once per batch, as _finish: the same across the guard's replays

    async def write() -> None:
        await RatingsStore(redis).write(entries, batch=batch)  # type: ignore[arg-type]
        await Claims(redis).mark_done(done, settled=settled, saved=saved, batch=batch)  # type: ignore[arg-type]
    return write


async def _exact(redis: Redis, tag: str) -> None:
    claims, ratings = Claims(redis), RatingsStore(redis)  # type: ignore[arg-type]
    tokens, cost = sum(100 + i for i in range(PAIRS)), sum(1_000 + i for i in range(PAIRS))
    for p in range(PROJECTS):
        project, group = f"p-{tag}-{p}", f"g-{tag}-{p}"
        assert await claims.tokens_used(project, 3600) == tokens, (project, "tokens")
        assert await claims.cost_used(project, 3600) == cost, (project, "money")
        assert await claims.saved(project, 3600) == (PAIRS, sum(10 + i for i in range(PAIRS))), (project, "saved")
        history = await ratings.history(group, "1h")
        spent = history.spent()
        assert (history.count, history.scored) == (PAIRS, PAIRS), (group, "counts")
        assert (spent.judge_calls, spent.tokens, spent.cost) == (PAIRS, tokens, cost), (group, "spend")
        documents, _ = await ratings.results(group, limit=50)
        assert len(documents) == PAIRS, (group, "latest results: each kept once")


@pytest.mark.parametrize("client", ["the worker's", "one that never retries"])
async def test_a_finish_cut_anywhere_in_its_pipeline_counts_everything_exactly_once(redis_url: str,
                                                                                     client: str) -> None:
    """The worker's own client resends a pipeline on a new connection itself (the same scripts,
    the same batch); a client that never retries hands every cut to the outage guard, which
    writes the batch again - both must count it once."""
    target = urlparse(redis_url)
    proxy = CuttingProxy(target.hostname or "127.0.0.1", target.port or 6379)
    port = await proxy.start()
    url = f"redis://127.0.0.1:{port}{target.path or '/0'}"
    redis: Redis = (redis_client(Settings(redis_url=url)) if client == "the worker's"  # type: ignore[assignment]
                    else Redis.from_url(url, socket_timeout=5, retry=Retry(NoBackoff(), 0)))
    guard = OutageGuard(tolerance_s=60)
    try:
        tag = uuid.uuid4().hex[:8]
        await _finish(redis, f"{tag}-ww")()  # the scripts loaded: later finishes send their SHAs only
        proxy.cut_after(None)  # measure: the finish's bytes, uncut
        await _finish(redis, f"{tag}-mm")()
        length = proxy.sent
        await _exact(redis, f"{tag}-mm")
        assert length > 1_000, length
        for n in range(POINTS):
            at = 1 + n * (length - 64) // (POINTS - 1)  # the last before the end: lengths vary by a few bytes
            point = f"{tag}-{n:02d}"  # as long as the measured one's
            write = _finish(redis, point)
            await redis.ping()  # a connection in the pool: the cut falls inside the finish
            proxy.cut_after(at)
            await guard.call(write)
            assert proxy.cuts == n + 1, f"the cut at byte {at} of {length} did not happen"
            await _exact(redis, point)
    finally:
        await redis.aclose()
        await proxy.close()
