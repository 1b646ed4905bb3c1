"""The catalog's write turn across API processes, on the real Redis: writers of several processes
at once never lose the optimistic race (no 409), the turn goes round the processes in the order
they asked, a process that dies holding it or waiting for it holds up the others for a lease at
most, and two real API processes under a write storm answer every write 201."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from adapters.stores import keys
from adapters.stores.catalog import CatalogStore, SnapshotCache, Write
from scoring.catalog import CatalogSnapshot
from scoring.models import Pattern
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

PROCESSES = 6
WRITES = 40  # per process


def pattern(project: str, n: int) -> Pattern:
    return Pattern(id=f"{project}-{n}", name="P", project_id=project, polarity="failure", template="apology")


async def test_writers_of_many_processes_never_lose_the_race(redis_databases: RedisDatabases) -> None:
    """Six processes' stores (each its own cache, turn and connection) write 40 documents each, all
    at once: every write lands, none is refused as a conflict."""
    with redis_databases.lease() as url:
        clients = [connect(url) for _ in range(PROCESSES)]
        try:
            stores = [CatalogStore(client, actor=f"p{n}", cache=SnapshotCache(), writer=f"p-{n}")
                      for n, client in enumerate(clients)]

            async def put(store: CatalogStore, doc: Pattern) -> str:
                try:
                    await store.write(lambda _: [("patterns", doc.id, doc)])
                except Exception as exc:  # what the API would answer: a 409, a 429
                    return type(exc).__name__
                return "written"

            outcomes = await asyncio.gather(*(put(store, pattern(f"p-{n}", w))
                                              for n, store in enumerate(stores) for w in range(WRITES)))
            assert Counter(outcomes) == {"written": PROCESSES * WRITES}
            snapshot = await CatalogStore(clients[0]).snapshot()
            assert len(snapshot.patterns) == PROCESSES * WRITES
        finally:
            for client in clients:
                await client.aclose()


async def test_the_turn_goes_round_the_processes_in_the_order_they_asked(redis_databases: RedisDatabases) -> None:
    """Process X has 20 writes waiting; process Y's one write, asked while X writes, is committed
    within X's next two - not after X's 20."""
    with redis_databases.lease() as url:
        x_client, y_client = connect(url), connect(url)
        try:
            x = CatalogStore(x_client, actor="x", cache=SnapshotCache(), writer="p-x")
            y = CatalogStore(y_client, actor="y", cache=SnapshotCache(), writer="p-y")
            order: list[str] = []
            x_writing = asyncio.Event()

            def put(store: CatalogStore, doc: Pattern) -> asyncio.Task[CatalogSnapshot]:
                def change(_: CatalogSnapshot) -> list[Write]:
                    order.append(doc.id)
                    x_writing.set()
                    return [("patterns", doc.id, doc)]
                return asyncio.create_task(store.write(change))

            storm = [put(x, pattern("p-x", n)) for n in range(20)]
            await x_writing.wait()
            mine = put(y, pattern("p-y", 0))
            await asyncio.gather(*storm, mine)
            assert order.index("p-y-0") <= 3, order
            assert len(set(order)) == 21
        finally:
            await x_client.aclose()
            await y_client.aclose()


async def test_a_process_that_died_holding_or_awaiting_the_turn_holds_no_one_for_long(
        redis_databases: RedisDatabases) -> None:
    with redis_databases.lease() as url:
        client = connect(url)
        try:
            # A process died while holding the turn (its lease runs), and another while waiting
            # first in the queue (it stops asking).
            await client.set(keys.CATALOG_TURN, "dead-holder", px=keys.CATALOG_TURN_LEASE_MS)
            await client.zadd(keys.CATALOG_TURN_QUEUE, {"dead-waiter": 0})
            await client.zadd(keys.CATALOG_TURN_SEEN, {"dead-waiter": 0})
            store = CatalogStore(client, actor="alive", cache=SnapshotCache(), writer="p-alive")
            loop = asyncio.get_running_loop()
            began = loop.time()
            await store.write(lambda _: [("patterns", "alive-0", pattern("p-alive", 0))])
            waited = loop.time() - began
            assert waited <= keys.CATALOG_TURN_LEASE_MS / 1000 + 1, waited
            assert await client.zscore(keys.CATALOG_TURN_QUEUE, "dead-waiter") is None, "the silent waiter left"
        finally:
            await client.aclose()


@pytest.fixture
def two_apis(redis_databases: RedisDatabases, tmp_path: Path) -> Iterator[tuple[list[ApiProcess], list[str], str]]:
    with redis_databases.lease() as url:
        tokens = [create_key(url, "--project", f"p-fleet-{n}") for n in range(4)]
        processes = [ApiProcess(url, tmp_path / f"api-{n}.log").start() for n in range(2)]
        try:
            yield processes, tokens, url
        finally:
            for process in processes:
                process.stop()


async def test_two_api_processes_answer_every_write_of_a_storm(
        two_apis: tuple[list[ApiProcess], list[str], str]) -> None:
    """Four projects write 40 patterns each, half through each API process, all at once; the turn
    is given back after the last."""
    processes, tokens, url = two_apis
    clients = [httpx.AsyncClient(base_url=p.url, timeout=60) for p in processes]
    try:
        async def write(n: int, token: str, w: int) -> httpx.Response:
            return await clients[w % 2].post("/v1/patterns", headers={"Authorization": f"Bearer {token}"},
                                             json={"name": f"P{n}-{w}", "polarity": "failure", "template": "apology"})

        answers = await asyncio.gather(*(write(n, token, w) for n, token in enumerate(tokens) for w in range(WRITES)))
    finally:
        for client in clients:
            await client.aclose()
    statuses = Counter(r.status_code for r in answers)
    assert statuses == {201: len(tokens) * WRITES}, (statuses, [r.text for r in answers if r.status_code != 201][:3])
    redis = connect(url)
    try:
        assert not await redis.exists(keys.CATALOG_TURN, keys.CATALOG_TURN_QUEUE), "no turn held or awaited"
    finally:
        await redis.aclose()
