"""The session sweeper's bookkeeping on the real Redis and broker: a conversation another worker
is judging stays in the index and is judged once that worker's lease runs out; one judged at
its length is not judged again; turns that no longer read never block a session or the others."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from adapters.stores import keys
from adapters.stores.claims import Claims
from adapters.stores.sessions import QuietSession, SessionStore
from tests.support.session_sweeps import Sweep, project_sweep, session_group, turn

pytestmark = pytest.mark.integration


@pytest.fixture
async def sweep(redis: Redis, kafka_bootstrap: str, unique: str) -> AsyncIterator[Sweep]:
    async with project_sweep(redis, kafka_bootstrap, unique) as s:
        yield s


async def test_busy_sessions_stay_until_judged_and_judged_ones_are_not_judged_again(sweep: Sweep) -> None:
    sweeper = sweep.sweeper(sweep.catalog())
    now = time.time()
    await sweep.add_turns("s-busy", 2, at=now - 5)
    await sweep.add_turns("s-free", 2, at=now - 5)
    # Another worker holds the lease on s-busy at 2 turns.
    (held,) = await Claims(sweep.redis, lease_s=1.0).claim_many([sweep.claim("s-busy", 2)])
    assert held.state == "claimed"

    assert await sweeper.sweep_once(now=now) == 1, "only s-free was ours to judge"
    assert await sweep.index() == {"s-busy"}, "s-free is settled and leaves the index; s-busy stays"

    assert await sweeper.sweep_once(now=now) == 0, "still busy: nobody judges it twice"
    await asyncio.sleep(1.1)  # the other worker died: its lease runs out
    assert await sweeper.sweep_once(now=time.time()) == 1
    assert await sweeper.sweep_once(now=time.time()) == 0, "judged at this length: not again"
    assert await sweep.ratings(2, settle_s=1) == [("conv", "s-busy", 2), ("conv", "s-free", 2)]


@pytest.mark.parametrize("depth", [150, 199, 255])
async def test_turns_that_no_longer_read_never_block_a_session_or_the_others(sweep: Sweep, depth: int) -> None:
    # Stored before the decoder refused deep nesting (or written by anything else): turns the
    # sweep cannot read are left out, and the sessions are judged on what reads.
    sweeper = sweep.sweeper(sweep.catalog())
    now = time.time()
    await sweep.add_turns("s-odd", 2, at=now - 5)
    await sweep.add_turns("s-fine", 2, at=now - 5)
    deep = turn(sweep.project, "s-odd", 3).model_dump_json(by_alias=True).replace('"fine"', "[" * depth + "]" * depth)
    await sweep.redis.hset(keys.session_turns(sweep.project, "s-odd"), "s-odd-3", deep)
    await sweep.redis.hset(keys.session_turns(sweep.project, "s-odd"), "s-odd-4", b"\xff not json")

    assert await sweeper.sweep_once(now=now) == 2
    judged = {session for _, session, _ in await sweep.ratings(2)}
    assert judged == {"s-odd", "s-fine"}
    assert await sweep.index() == set(), "both are settled and leave the index"


class ReadsRecorded(SessionStore):
    """The real store, noting how long each session it hands the sweep had been quiet."""

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self.quiet_for: list[float] = []

    async def quiet(self, project_id: str, quiet_for_s: float, now: float | None = None,
                    offset: int = 0, limit: int = 200) -> list[QuietSession]:
        found = await super().quiet(project_id, quiet_for_s, now, offset, limit)
        assert now is not None
        self.quiet_for += [now - s.last_activity for s in found]
        return found


async def test_a_session_is_judged_only_once_quiet_for_its_groups_idle_seconds(sweep: Sweep) -> None:
    catalog = sweep.catalog(session_group(sweep.project, "fast", idle=10), session_group(sweep.project, "slow", idle=60))
    store = ReadsRecorded(sweep.redis)
    sweeper = sweep.sweeper(catalog, store=store)
    t0 = float(int(time.time()))  # whole seconds: t0 + 10 - 10 is exactly t0
    await sweep.add_turns("s-idle", 2, at=t0)
    for n in range(3):  # busier conversations, still talking
        await sweep.add_turns(f"s-busy{n}", 2, at=t0 + 5)

    assert await sweeper.sweep_once(now=t0 + 9) == 0, "quiet 9 s: no group's idle time has passed"
    assert store.quiet_for == [], "nothing quiet for the shortest idle time is even read"
    assert await sweeper.sweep_once(now=t0 + 10) == 1, "quiet 10 s: only the 10 s group judges it"
    for n in range(3):
        await sweep.store.add_turns([turn(sweep.project, f"s-busy{n}", 3)], now=t0 + 55)
    assert await sweeper.sweep_once(now=t0 + 59) == 0, "judged by fast at 2 turns; slow still waits"
    assert "s-idle" in await sweep.index(), "a group has yet to judge it"
    assert await sweeper.sweep_once(now=t0 + 60) == 1, "quiet 60 s: now the slow group"
    assert "s-idle" not in await sweep.index(), "quiet for every group's idle time and judged: it leaves the index"
    assert min(store.quiet_for) >= 10, "the sweep reads only sessions quiet for the shortest idle time"
    assert await sweep.ratings(2) == [("fast", "s-idle", 2), ("slow", "s-idle", 2)]



class ReadsCounted(SessionStore):
    """The real store, counting the projects whose sessions the sweep reads."""

    def __init__(self, redis: Redis) -> None:
        super().__init__(redis)
        self.read: list[str] = []

    async def quiet(self, project_id: str, quiet_for_s: float, now: float | None = None,
                    offset: int = 0, limit: int = 200) -> list[QuietSession]:
        self.read.append(project_id)
        return await super().quiet(project_id, quiet_for_s, now, offset, limit)


async def test_a_sweep_reads_only_the_projects_with_conversations_open(sweep: Sweep) -> None:
    """30 projects have session groups and no conversation: after the first sweep (every project,
    what the index may have missed) a sweep reads none of them - only the project a turn came to,
    which leaves the index once its conversation is judged and forgotten, and not while turns come."""
    idle = [f"{sweep.project}-idle-{n}" for n in range(30)]
    groups = [session_group(sweep.project), *(session_group(p, group_id=f"conv-{p}") for p in idle)]
    store = ReadsCounted(sweep.redis)
    sweeper = sweep.sweeper(sweep.catalog(*groups), store=store)
    now = time.time()

    await sweeper.sweep_once(now=now)
    assert sorted(store.read) == sorted([sweep.project, *idle]), "the first sweep looks at every project"
    store.read.clear()
    await sweeper.sweep_once(now=now)
    assert store.read == [], "no conversation open: no project's sessions read"

    await sweep.add_turns("s-1", 2, at=now - 5)
    assert sweep.project in await store.open_projects()
    assert await sweeper.sweep_once(now=now) == 1
    assert store.read == [sweep.project], "only the project a turn came to"
    assert sweep.project not in await store.open_projects(), "judged and forgotten: it leaves the index"

    store.read.clear()
    await sweeper.sweep_once(now=now)
    assert store.read == []


async def test_a_project_whose_turn_came_during_the_sweep_stays_open(sweep: Sweep) -> None:
    store = sweep.store
    await sweep.add_turns("s-1", 2, at=time.time() - 5)
    seen = (await store.open_projects())[sweep.project]
    await sweep.redis.delete(keys.session_activity(sweep.project))  # the sweep forgot its sessions
    await sweep.add_turns("s-2", 1, at=time.time())  # ... while another turn came
    await sweep.redis.delete(keys.session_activity(sweep.project))
    await store.reindex(sweep.project, seen)
    assert sweep.project in await store.open_projects(), "a turn came since the sweep read it"
    await store.reindex(sweep.project, (await store.open_projects())[sweep.project])
    assert sweep.project not in await store.open_projects()
