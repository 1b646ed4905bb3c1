"""The catalog: judges, patterns, custom evaluators, scorer groups, budgets and alert channels,
stored in Redis as versioned JSON documents.

Writes are serialized by an optimistic check on one version key: each write WATCHes it, reads
the catalog, validates the change against what is stored, and commits the documents and the
next version in one transaction - or starts again when another writer got there first. So two
people updating one group never lose an update, and a rule that spans documents (a live group
may not hold a judge that requires an expected answer) holds whichever side changes.

Readers take an immutable ``scoring.catalog.CatalogSnapshot``; workers keep one current through
``CatalogWatcher`` (pub/sub, plus a periodic version check as a safety net) and swap it whole,
so a trace is never scored with half of an old group and half of a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import orjson
import structlog
from redis.asyncio.client import Pipeline
from redis.asyncio.cluster import ClusterPipeline
from redis.exceptions import WatchError

from scoring.catalog import KIND_MODELS, CatalogSnapshot
from scoring.errors import Conflict
from scoring.models import WireModel
from scoring.stores import changes, keys
from scoring.stores.client import RedisClient

log = structlog.get_logger(__name__)

WRITE_ATTEMPTS = 20

Write = tuple[str, str, WireModel | None]  # (kind, id, document or None to delete)


class SnapshotCache:
    """The last snapshot a process read, reused while the catalog's version is unchanged: a read
    then costs one GET instead of reading and validating every document (the HTTP API)."""

    def __init__(self) -> None:
        self.current: CatalogSnapshot | None = None


class CatalogStore:
    """``actor`` names who writes through this store, in the change log of every document;
    ``cache`` (shared by the stores of one process) makes unchanged-catalog reads cheap."""

    def __init__(self, redis: RedisClient, actor: str = "local", cache: SnapshotCache | None = None) -> None:
        self.redis = redis
        self.actor = actor
        self._cache = cache

    async def version(self) -> int:
        return int(await self.redis.get(keys.CATALOG_VERSION) or 0)

    async def snapshot(self) -> CatalogSnapshot:
        cached = self._cache.current if self._cache is not None else None
        if cached is not None and await self.version() == cached.version:
            return cached  # every write bumps the version, so an equal one is this very catalog
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.get(keys.CATALOG_VERSION)
            for kind in KIND_MODELS:
                pipe.hgetall(keys.catalog_hash(kind))
            version, *hashes = await pipe.execute()
        snapshot = _decode(version, hashes)
        if self._cache is not None:
            self._cache.current = snapshot
        return snapshot

    async def write(self, change: Callable[[CatalogSnapshot], list[Write]]) -> CatalogSnapshot:
        """Apply ``change`` to the current catalog atomically. ``change`` validates against the
        snapshot it is given (raising a CatalogError) and says what to write; it may be called
        again with a newer snapshot if another writer committed first. Returns the new catalog."""
        for _ in range(WRITE_ATTEMPTS):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    current = await self._watched_snapshot(pipe)
                    writes = change(current)
                    if not writes:
                        return current
                    pipe.multi()  # type: ignore[no-untyped-call]
                    after = current.version + 1
                    for kind, id_, doc in writes:
                        if doc is None:
                            pipe.hdel(keys.catalog_hash(kind), id_)
                        else:
                            envelope = {"v": after, "doc": doc.stored()}
                            pipe.hset(keys.catalog_hash(kind), id_, orjson.dumps(envelope))
                        before = getattr(current, kind).get(id_)
                        if before is doc or (before and doc and before.stored() == doc.stored()):
                            continue  # nothing changed: nothing to record
                        log_key = keys.catalog_changes(kind, id_)
                        pipe.lpush(log_key, changes.entry(self.actor, before, doc))
                        pipe.ltrim(log_key, 0, keys.CHANGES_KEPT - 1)
                    pipe.set(keys.CATALOG_VERSION, after)
                    await pipe.execute()
                except WatchError:
                    continue
            # After the transaction, not in it: a Redis Cluster refuses PUBLISH in a pipeline. A
            # notice lost here (a crash in between) is made up by the watchers' version poll.
            await self.redis.publish(keys.CATALOG_CHANNEL, after)
            log.info("catalog changed", version=after,
                     changes=[f"{'delete' if d is None else 'put'} {k}/{i}" for k, i, d in writes])
            return await self.snapshot()
        raise Conflict(f"the catalog kept changing during {WRITE_ATTEMPTS} attempts to write; try again")

    async def _watched_snapshot(self, pipe: Pipeline | ClusterPipeline) -> CatalogSnapshot:
        await pipe.watch(keys.CATALOG_VERSION)
        version = await pipe.get(keys.CATALOG_VERSION)
        hashes = [await pipe.hgetall(keys.catalog_hash(kind)) for kind in KIND_MODELS]
        return _decode(version, hashes)


def _decode(version: Any, hashes: list[Any]) -> CatalogSnapshot:
    maps: dict[str, dict[str, Any]] = {}
    for kind, raw in zip(KIND_MODELS, hashes, strict=True):
        model = KIND_MODELS[kind]
        docs: dict[str, Any] = {}
        for id_, value in raw.items():
            try:
                docs[id_.decode()] = model.model_validate(orjson.loads(value)["doc"])
            except Exception:  # one bad document must not take the whole catalog down
                log.exception("catalog document is unreadable; it is left out", kind=kind, id=id_)
        maps[kind] = docs
    return CatalogSnapshot(int(version or 0), **maps)


STOP_WAIT_S = 5.0  # how long stop() waits for the watch to end


class CatalogWatcher:
    """Keeps a current snapshot in a running worker: reloads on every change notice, and checks
    the version every ``poll_s`` in case a notice was missed (pub/sub is at-most-once)."""

    def __init__(self, store: CatalogStore, *, poll_s: float = 0.5,
                 on_change: Callable[[CatalogSnapshot], None] | None = None,
                 on_lost: Callable[[bool], None] | None = None) -> None:
        self._store = store
        self._poll_s = poll_s
        self._on_change = on_change
        self._on_lost = on_lost
        self.lost = False  # Redis answered with no catalog after we had one
        self.current = CatalogSnapshot()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> CatalogSnapshot:
        self.current = await self._store.snapshot()
        self._task = asyncio.create_task(self._watch(), name="catalog-watcher")
        return self.current

    async def stop(self) -> None:
        """Cancel the watch and wait for it a few seconds at most: closing its pubsub connection
        under a cancellation has been seen to hang in redis-py (a suite run waited 300 s), and a
        worker's shutdown must not wait on it."""
        if self._task is not None:
            self._task.cancel()
            done, _ = await asyncio.wait({self._task}, timeout=STOP_WAIT_S)
            if not done:
                log.warning("the catalog watch did not stop in time; left behind", wait_s=STOP_WAIT_S)

    async def refresh(self) -> None:
        version = await self._store.version()
        if version == self.current.version:
            return
        if version == 0 and self.current.version > 0:
            # No catalog at all after one existed: Redis lost its data (a restart without
            # persistence, a failover to an empty replica). Never a real change - deleting every
            # document still leaves a version - so keep scoring with what we have.
            if not self.lost:
                self.lost = True
                log.error("the catalog is gone from Redis; keeping the last snapshot", version=self.current.version,
                          groups=len(self.current.groups))
                if self._on_lost is not None:
                    self._on_lost(True)
            return
        if self.lost:
            self.lost = False
            log.info("a catalog is back in Redis", version=version)
            if self._on_lost is not None:
                self._on_lost(False)
        self.current = await self._store.snapshot()
        log.info("catalog reloaded", version=self.current.version, groups=len(self.current.groups))
        if self._on_change is not None:
            self._on_change(self.current)

    async def _watch(self) -> None:
        while True:
            pubsub = self._store.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(keys.CATALOG_CHANNEL)
                await self.refresh()  # a change between the snapshot and the subscription
                while True:
                    await pubsub.get_message(timeout=self._poll_s)
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("catalog watch interrupted; retrying", exc_info=True)
                await asyncio.sleep(self._poll_s)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
