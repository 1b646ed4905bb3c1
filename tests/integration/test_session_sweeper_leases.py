"""The session sweeper as a loop, and its leases, on the real Redis and broker: it sweeps every
interval and rides out a failed sweep; a sweep that lost a session's lease to another worker
publishes nothing for it; a sweep cut short gives its leases back at once (and ends as cut short
even when they cannot be given back); a member that failed while the process stood still is
judged again, not published."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from structlog.testing import capture_logs

from adapters.egress import EgressPolicy
from adapters.members.external import ExternalClient
from adapters.stores.claims import Claims
from consumers.events import Silent
from consumers.pauses import PauseWatch
from scoring.blend import MemberOutcome, blend
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import ClaimRequest
from scoring.models import CustomEvaluator, Judge, ScorerGroup
from scoring.panel import GroupResult, Panel
from scoring.subjects import Subject
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.session_sweeps import Sweep, project_sweep, session_group

pytestmark = pytest.mark.integration


@pytest.fixture
async def sweep(redis: Redis, kafka_bootstrap: str, unique: str) -> AsyncIterator[Sweep]:
    async with project_sweep(redis, kafka_bootstrap, unique) as s:
        yield s


@pytest.fixture
async def remote() -> AsyncIterator[tuple[ScriptedServer, Panel]]:
    """An external scorer (answers 1.0 unless scripted otherwise) and a panel that calls it."""
    client = ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]))
    with ScriptedServer(default=Reply(body={"score": 1.0})) as server:
        yield server, Panel(external=client)
    await client.close()


def remote_catalog(sweep: Sweep, server: ScriptedServer) -> CatalogSnapshot:
    return sweep.catalog(
        session_group(sweep.project, members=[{"kind": "custom", "refId": "remote", "weight": 1, "gate": False}]),
        customs={"remote": CustomEvaluator(id="remote", name="Remote", type="external", url=server.url,
                                           timeout_ms=10_000)})


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_the_sweeper_sweeps_every_interval_rides_out_a_failed_sweep_and_stops_when_told(sweep: Sweep) -> None:
    catalog = sweep.catalog()
    reads = 0

    def current() -> CatalogSnapshot:
        nonlocal reads
        reads += 1
        if reads == 1:
            raise RuntimeError("the catalog is not loaded yet")
        return catalog

    await sweep.add_turns("s-1", 2, at=time.time() - 5)
    stop = asyncio.Event()
    with capture_logs() as logs:
        loop = asyncio.create_task(sweep.sweeper(current, interval_s=0.05).run(stop))

        async def judged() -> bool:
            assert not loop.done(), loop
            return await sweep.index() == set()

        await until(judged, "a sweep after the failed one")
        stop.set()
        await asyncio.wait_for(loop, timeout=10)
    (failed,) = [e for e in logs if e["log_level"] == "error"]
    assert failed["event"] == "the session sweep failed; trying again on the next tick" and failed["exc_info"] is True
    assert await sweep.ratings(1) == [("conv", "s-1", 2)]


async def test_a_sweep_that_lost_its_lease_publishes_nothing_and_leaves_the_session_to_its_new_owner(
        sweep: Sweep, remote: tuple[ScriptedServer, Panel]) -> None:
    # Our sweep stalls on a slow scorer past its half-second lease; another worker takes the
    # session over meanwhile. Publishing now would put a second value under the pair's id.
    server, panel = remote
    server.script(Reply(body={"score": 0.0}, delay_s=2))
    sweeper = sweep.sweeper(remote_catalog(sweep, server), panel=panel, claims=Claims(sweep.redis, lease_s=0.5))
    now = time.time()
    await sweep.add_turns("s-1", 2, at=now - 5)
    stalled = asyncio.create_task(sweeper.sweep_once(now=now))

    async def scoring() -> bool:
        return bool(server.requests)

    await until(scoring, "our sweep to call the scorer")
    other = Claims(sweep.redis, lease_s=60)

    async def taken_over() -> bool:
        (claim,) = await other.claim_many([sweep.claim("s-1", 2)])
        return claim.state == "claimed"

    await until(taken_over, "our lease to run out")
    assert await stalled == 0, "nothing judged by us"
    assert (await other.stored(sweep.claim("s-1", 2))).startswith("lease:"), "not marked done by us"
    assert await sweep.index() == {"s-1"}, "it stays in the index until its new owner judged it"
    assert await sweep.published(0, settle_s=1) == []


async def test_a_cancelled_sweep_gives_its_leases_back_at_once(sweep: Sweep,
                                                               remote: tuple[ScriptedServer, Panel]) -> None:
    server, panel = remote
    server.script(Reply(body={"score": 0.0}, delay_s=5))
    catalog = remote_catalog(sweep, server)
    now = time.time()
    await sweep.add_turns("s-1", 2, at=now - 5)
    cut_short = asyncio.create_task(sweep.sweeper(catalog, panel=panel, claims=Claims(sweep.redis, lease_s=60))
                                    .sweep_once(now=now))

    async def scoring() -> bool:
        return bool(server.requests)

    await until(scoring, "the sweep to call the scorer")
    cut_short.cancel()  # the worker shuts down mid-sweep
    with pytest.raises(asyncio.CancelledError):
        await cut_short
    assert await sweep.index() == {"s-1"}
    another_worker = sweep.sweeper(catalog, panel=panel, claims=Claims(sweep.redis, lease_s=60))
    assert await another_worker.sweep_once(now=now) == 1, "no 60 s lease to wait out"
    assert await sweep.ratings(1) == [("conv", "s-1", 2)]


class UnreleasingClaims(Claims):
    """Real claims whose release fails, as with Redis gone at that moment."""

    tried = 0

    async def release(self, requests: list[ClaimRequest]) -> None:
        self.tried += 1
        raise RedisConnectionError("redis went away while giving up leases")


async def test_a_cancelled_sweep_whose_leases_cannot_be_given_back_still_ends_as_cancelled(
        sweep: Sweep, remote: tuple[ScriptedServer, Panel]) -> None:
    # Giving leases back is a courtesy (they expire anyway): its failure must not replace why the
    # sweep ended, here the worker shutting down.
    server, panel = remote
    server.script(Reply(body={"score": 0.0}, delay_s=5))
    now = time.time()
    await sweep.add_turns("s-1", 2, at=now - 5)
    claims = UnreleasingClaims(sweep.redis, lease_s=60)
    cut_short = asyncio.create_task(sweep.sweeper(remote_catalog(sweep, server), panel=panel, claims=claims)
                                    .sweep_once(now=now))

    async def scoring() -> bool:
        return bool(server.requests)

    await until(scoring, "the sweep to call the scorer")
    cut_short.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cut_short
    assert claims.tried == 1
    assert (await claims.stored(sweep.claim("s-1", 2))).startswith("lease:"), "left to expire"


class Rescored(Silent):
    def __init__(self) -> None:
        self.rescored: list[int] = []

    def rescored_after_pause(self, count: int) -> None:
        self.rescored.append(count)


class StandsStillOnce(Panel):
    """Scores as the panel does; while the first pair is scored, the process stands still 1.5 s
    (nothing on the loop runs, as under SIGSTOP) and its member's deadline passes on the clock."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def _stand_still(self, group: ScorerGroup, subject: Subject, result: GroupResult) -> GroupResult:
        self.calls += 1
        if self.calls > 1:
            return result
        time.sleep(1.5)
        member = group.members[0]
        timed_out = MemberOutcome(name=member.ref_id, kind=member.kind, weight=member.weight, gate=member.gate,
                                  ref_id=member.ref_id, error="timed out after 1s")
        return GroupResult(group, subject, blend([timed_out]))

    async def score(self, group: ScorerGroup, subject: Subject, scorers: Any, spend: Any = None,
                    verdicts: Any = None) -> GroupResult:
        return self._stand_still(group, subject, await super().score(group, subject, scorers, spend=spend,
                                                                     verdicts=verdicts))

    async def score_many(self, items: list[tuple[ScorerGroup, Subject]], scorers: Any) -> list[GroupResult]:
        # Groups that wait on nothing (this test's) are scored in bulk, as in the trace loop.
        results = await super().score_many(items, scorers)
        return [self._stand_still(g, s, r) for (g, s), r in zip(items, results, strict=True)]


async def test_a_member_failed_while_the_process_stood_still_is_judged_again_not_published(
        sweep: Sweep) -> None:
    # "A pause is not a timeout": the process stands still while the conversation is judged, and
    # its member times out - on the clock, not on the scorer. The sweep hands it back (its lease
    # given up); the next sweep judges it afresh, and only that verdict is published.
    await sweep.add_turns("s-1", 2, at=time.time() - 5)
    pauses, events, panel, stop = PauseWatch(), Rescored(), StandsStillOnce(), asyncio.Event()
    sweeper = sweep.sweeper(sweep.catalog(), panel=panel, events=events, pauses=pauses)
    watching = asyncio.create_task(pauses.run(stop))
    try:
        assert await sweeper.sweep_once() == 0, "handed back, not published"
        assert events.rescored == [1]
        assert await sweep.index() == {"s-1"}, "the conversation stays, to be judged again"
        assert await sweeper.sweep_once() == 1
    finally:
        stop.set()
        await watching
    (rating,) = await sweep.published(1, settle_s=1)
    assert (rating["rating"], rating["members"][0]["status"]) == (10.0, "scored"), "the fresh verdict alone"
    assert panel.calls == 2


async def test_a_member_that_failed_without_a_pause_is_published_as_it_is(sweep: Sweep) -> None:
    await sweep.add_turns("s-1", 2, at=time.time() - 5)
    events, stop, pauses = Rescored(), asyncio.Event(), PauseWatch()
    catalog = sweep.catalog(session_group(sweep.project, members=[
        {"kind": "judge", "refId": "quality", "weight": 1, "gate": False}]),
        judges={"quality": Judge(id="quality", name="Quality", criteria="Helpful?")})
    watching = asyncio.create_task(pauses.run(stop))
    try:  # no judge client here: the judge member fails at once - a verdict about the pair
        assert await sweep.sweeper(catalog, events=events, pauses=pauses).sweep_once() == 1
    finally:
        stop.set()
        await watching
    assert events.rescored == []
    (rating,) = await sweep.published(1, settle_s=1)
    assert rating["members"][0]["status"] == "failed"
