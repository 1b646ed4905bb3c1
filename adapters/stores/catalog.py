"""The catalog: judges, patterns, custom evaluators, scorer groups, budgets and alert channels, in Redis.

Versioned JSON documents; readers take an immutable ``scoring.catalog.CatalogSnapshot`` and swap it whole.
The one rule: every write WATCHes the one version key and commits its documents, a log entry and the next
version in one transaction (or starts again), so no update is lost and a rule spanning documents holds.
Writes and reads in full: docs/design-notes.md.
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

from adapters.stores import changes, keys
from adapters.stores.catalog_turn import CatalogTurn
from adapters.stores.client import RedisClient, by_sha
from scorer_groups.review_queues import KEPT_PER_OPEN
from scoring.catalog import KIND_MODELS, CatalogSnapshot
from scoring.catalog_index import project_of
from scoring.errors import Conflict, InvalidDocument, QuotaExceeded, TooMany
from scoring.frozen import frozen
from scoring.members.fair_share import FairShare
from scoring.models import WireModel

log = structlog.get_logger(__name__)

WRITE_ATTEMPTS = 20
DELTA_ON_LOOP = 200  # documents of a delta decoded on the event loop (~60 ms at most); more: in a thread
KINDS = tuple(KIND_MODELS)  # the kinds' hashes, in this order among the script's keys

Write = tuple[str, str, WireModel | None]  # (kind, id, document or None to delete)

# The catalog's changes since a version, read at one version in one round trip: the documents
# the log names after ``since``, each once, as they are now. {version}: nothing changed;
# {version, 0}: the log cannot tell (too far behind, trimmed, a version written without an entry,
# a kind this release does not know), read the catalog whole; else {version, 1, kind's place in
# KINDS from 1, id, document or nil, ...}. The log names kinds by name: releases may add kinds.
_CHANGES_SINCE = """
local version = tonumber(redis.call('GET', KEYS[1]) or '0')
local since = tonumber(ARGV[1])
if version == since then return {version} end
local gap = version - since
if gap < 0 or gap > tonumber(ARGV[2]) then return {version, 0} end
local entries = redis.call('LRANGE', KEYS[2], 0, gap - 1)
if #entries < gap then return {version, 0} end
local place = {}  -- a kind's name -> its hash's place among KEYS (after the version and the log)
for i = 3, #ARGV do place[ARGV[i]] = i - 2 end
local out, seen = {version, 1}, {}
for i, raw in ipairs(entries) do
  local entry = cjson.decode(raw)
  if tonumber(entry.v) ~= version - i + 1 then return {version, 0} end
  for _, doc in ipairs(entry.docs) do
    local kind, id = place[doc[1]], doc[2]
    if kind == nil then return {version, 0} end  -- a kind this reader does not know: read whole
    if not seen[kind .. ':' .. id] then
      seen[kind .. ':' .. id] = true
      out[#out + 1] = kind
      out[#out + 1] = id
      out[#out + 1] = redis.call('HGET', KEYS[2 + kind], id) or false
    end
  end
end
return out
"""
_CHANGES_SINCE_KEYS = [keys.CATALOG_VERSION, keys.CATALOG_LOG, *(keys.catalog_hash(kind) for kind in KINDS)]


WAITING_WRITES = 64  # a project's catalog writes waiting for their turn in one process; past it, 429


class SnapshotCache:
    """The last snapshot a process read, brought up to date by the changes since it: a read
    then costs one script call and the changed documents, not every document (the HTTP API)."""

    def __init__(self) -> None:
        self.current: CatalogSnapshot | None = None
        # The process's writes take turns - in one process they would only lose each other's
        # optimistic race (a tenant's six writers made another's one write lose 20 times in a
        # row) - and the turns go round the projects waiting (``FairShare`` of one): one
        # tenant's 400 writes in flight held another's one write 6 s behind them first come,
        # first served. Across processes, each process's writer takes the fleet's turn.
        self.write_turns = FairShare(1)
        self.fleet_turn = CatalogTurn()


@frozen
class CatalogLimits:
    """What a project's documents may hold together, checked in the write's transaction (so two
    writes at once cannot both pass). None: no limit (the operators' ``catalog apply``)."""

    docs_per_kind: int | None = None  # SGW_CATALOG_MAX_DOCS_PER_PROJECT
    judge_examples: int | None = None  # SGW_JUDGE_MAX_EXAMPLES: examples a judge's prompt shows
    review_items: int | None = None  # SGW_MAX_PROJECT_REVIEW_ITEMS: items its queues keep (10 x capacity each)
    review_bytes: int | None = None  # SGW_MAX_PROJECT_REVIEW_BYTES: its queues' maxBytes, together


class CatalogStore:
    """``actor`` names who writes through this store, in the change log of every document;
    ``cache`` (shared by the stores of one process) makes reads cost what changed; ``limits``:
    what a project's documents may hold (``CatalogLimits``); ``writer``: whose turn a write takes
    (a project, or "" for the operators)."""

    def __init__(self, redis: RedisClient, actor: str = "local", cache: SnapshotCache | None = None,
                 limits: CatalogLimits | None = None, writer: str = "") -> None:
        self.redis = redis
        self.actor = actor
        self._writer = writer
        self._cache = cache
        self._limits = limits or CatalogLimits()
        self._changes_since = redis.register_script(_CHANGES_SINCE)

    async def version(self) -> int:
        return int(await self.redis.get(keys.CATALOG_VERSION) or 0)

    async def snapshot(self, base: CatalogSnapshot | None = None) -> CatalogSnapshot:
        """The catalog now: ``base`` (or the cache) with the changes since it, or read whole when
        there is no base or the log cannot tell what changed."""
        base = base or (self._cache.current if self._cache is not None else None)
        snapshot = await self._read(self.redis, base)
        if self._cache is not None:
            self._cache.current = snapshot
        return snapshot

    async def write(self, change: Callable[[CatalogSnapshot], list[Write]]) -> CatalogSnapshot:
        """Apply ``change`` to the current catalog atomically. ``change`` validates against the
        snapshot it is given (raising a CatalogError) and says what to write; it may be called
        again with a newer snapshot if another writer committed first. Returns the new catalog.

        A write costs what it changes: the snapshot it validates against is the cached one with
        the changes since (read under the WATCH), and the one it returns is that snapshot with
        its own writes - the catalog is never read or validated whole."""
        if self._cache is None:
            return await self._write(change)
        turns = self._cache.write_turns
        if turns.waiting_of(self._writer) >= WAITING_WRITES:
            raise TooMany(f"{WAITING_WRITES} catalog writes of this project are waiting already; send fewer at once")
        async with turns.slot(self._writer), self._cache.fleet_turn.held(self.redis):
            return await self._write(change)

    async def _write(self, change: Callable[[CatalogSnapshot], list[Write]]) -> CatalogSnapshot:
        base = self._cache.current if self._cache is not None else None
        for _ in range(WRITE_ATTEMPTS):
            async with self.redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(keys.CATALOG_VERSION)
                    current = base = await self._read(pipe, base)
                    writes = change(current)
                    if not writes:
                        return current
                    self._check_limits(current, writes)
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
                    # What this version changed, for every reader's delta (_CHANGES_SINCE).
                    entry = {"v": after, "docs": [[kind, id_] for kind, id_, _ in writes]}
                    pipe.lpush(keys.CATALOG_LOG, orjson.dumps(entry))
                    pipe.ltrim(keys.CATALOG_LOG, 0, keys.CATALOG_LOG_KEPT - 1)
                    pipe.set(keys.CATALOG_VERSION, after)
                    await pipe.execute()
                except WatchError:
                    continue
            # After the transaction, not in it: a Redis Cluster refuses PUBLISH in a pipeline. A
            # notice lost here (a crash in between) is made up by the watchers' version poll.
            await self.redis.publish(keys.CATALOG_CHANNEL, after)
            log.info("catalog changed", version=after,
                     changes=[f"{'delete' if d is None else 'put'} {k}/{i}" for k, i, d in writes])
            written = current.changed({(kind, id_): doc for kind, id_, doc in writes}, after)
            if self._cache is not None:
                self._cache.current = written
            return written
        raise Conflict(f"the catalog kept changing during {WRITE_ATTEMPTS} attempts to write; try again")

    def _check_limits(self, current: CatalogSnapshot, writes: list[Write]) -> None:
        """A project's documents are bounded by what it may store, not by what one request may
        send: that is what keeps one tenant's catalog (and what its documents make the workers
        keep) from costing every other's."""
        limits = self._limits
        added: dict[tuple[str, str], int] = {}
        for kind, id_, doc in writes:
            project = project_of(doc) if doc is not None else None
            if project is not None and id_ not in getattr(current, kind):
                added[(kind, project)] = added.get((kind, project), 0) + 1
        for (kind, project), count in added.items():
            used = current.count(kind, project)
            if limits.docs_per_kind is not None and used + count > limits.docs_per_kind:
                raise QuotaExceeded("SGW_CATALOG_MAX_DOCS_PER_PROJECT", kind, used, limits.docs_per_kind)
        queues = {project_of(doc) for kind, _, doc in writes if kind == "queues" and doc is not None}
        if queues - {None}:
            after = current.changed({(kind, id_): doc for kind, id_, doc in writes}, current.version)
            for project in queues - {None}:
                self._check_queues(current, after, project)  # type: ignore[arg-type]
        for kind, _, doc in writes:
            examples = getattr(doc, "examples", None) if kind == "judges" else None
            if limits.judge_examples is not None and examples is not None and len(examples) > limits.judge_examples:
                # 32 large examples made one call's prompt 310,000 characters
                raise InvalidDocument(f"examples: at most {limits.judge_examples} (SGW_JUDGE_MAX_EXAMPLES); "
                                      f"got {len(examples)}")

    def _check_queues(self, before: CatalogSnapshot, after: CatalogSnapshot, project: str) -> None:
        """The items a project's review queues may keep, together: each keeps up to 10 x its
        capacity items and its ``maxBytes`` of them (its script turns the rest away). A write
        that asks for no more than before always passes (a project over a lowered quota can
        shrink)."""
        def wanted(snapshot: CatalogSnapshot) -> tuple[int, int]:
            queues = [q for q in snapshot.queues.values() if q.project_id == project]
            return sum(KEPT_PER_OPEN * q.capacity for q in queues), sum(q.max_bytes for q in queues)

        (items_before, bytes_before), (items, stored) = wanted(before), wanted(after)
        limit = self._limits.review_items
        if limit is not None and items > limit and items > items_before:
            raise QuotaExceeded("SGW_MAX_PROJECT_REVIEW_ITEMS", "review items in its queues with this change "
                                "(10 x each queue's capacity)", items, limit)
        limit = self._limits.review_bytes
        if limit is not None and stored > limit and stored > bytes_before:
            raise QuotaExceeded("SGW_MAX_PROJECT_REVIEW_BYTES", "bytes of review items in its queues with this change "
                                "(each queue's maxBytes)", stored, limit)

    async def _read(self, client: RedisClient | Pipeline | ClusterPipeline,
                    base: CatalogSnapshot | None) -> CatalogSnapshot:
        """``base`` with the changes since it (one script call), or the catalog read whole."""
        if base is not None:
            reply = await self._call_changes_since(client, base.version)
            if len(reply) == 1:
                return base
            if reply[1]:
                # A delta of many documents (a catalog applied whole) is decoded beside the loop.
                if (len(reply) - 2) // 3 > DELTA_ON_LOOP:
                    return await asyncio.to_thread(_applied, base, reply)
                return _applied(base, reply)
        if isinstance(client, Pipeline | ClusterPipeline):  # watching: each command answers at once
            version = await client.get(keys.CATALOG_VERSION)
            hashes = [await client.hgetall(keys.catalog_hash(kind)) for kind in KINDS]
        else:
            async with client.pipeline(transaction=True) as pipe:  # one version: read in one transaction
                pipe.get(keys.CATALOG_VERSION)
                for kind in KINDS:
                    pipe.hgetall(keys.catalog_hash(kind))
                version, *hashes = await pipe.execute()
        # Read whole (a start, a lost delta): decoded beside the loop, not on it.
        return await asyncio.to_thread(_decode, version, hashes)

    async def _call_changes_since(self, client: RedisClient | Pipeline | ClusterPipeline, since: int) -> list[Any]:
        # By name: a cluster pipeline blocks its evalsha() method, yet routes EVALSHA by its keys.
        reply = await by_sha(client.execute_command, self._changes_since, _CHANGES_SINCE_KEYS,
                             [since, keys.CATALOG_LOG_KEPT, *KINDS], load=self.redis.script_load)
        return list(reply)


def _applied(base: CatalogSnapshot, reply: list[Any]) -> CatalogSnapshot:
    """``base`` with the documents a ``_CHANGES_SINCE`` reply names (kind, id, document or nil)."""
    changed: dict[tuple[str, str], WireModel | None] = {}
    for i in range(2, len(reply), 3):
        kind, id_ = KINDS[int(reply[i]) - 1], reply[i + 1].decode()
        changed[(kind, id_)] = _decoded(kind, id_, reply[i + 2])
    return base.changed(changed, int(reply[0]))


def _decoded(kind: str, id_: str, raw: bytes | None) -> WireModel | None:
    """One stored document, or None when deleted - or unreadable: one bad document must not take
    the whole catalog down."""
    if raw is None:
        return None
    try:
        return KIND_MODELS[kind].model_validate(orjson.loads(raw)["doc"])
    except Exception:
        log.exception("catalog document is unreadable; it is left out", kind=kind, id=id_)
        return None


def _decode(version: Any, hashes: list[Any]) -> CatalogSnapshot:
    maps: dict[str, Any] = {}
    for kind, raw in zip(KINDS, hashes, strict=True):
        docs: dict[str, Any] = {}
        for id_, value in raw.items():
            doc = _decoded(kind, id_.decode(), value)
            if doc is not None:
                docs[id_.decode()] = doc
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
        # The changes since our snapshot (a delta: the changed documents), or the catalog whole.
        self.current = await self._store.snapshot(base=self.current)
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
