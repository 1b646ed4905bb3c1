"""The catalog: judges, patterns, custom evaluators, scorer groups, budgets and alert channels,
stored in Redis as versioned JSON documents.

Writes are serialized by an optimistic check on one version key: each write WATCHes it, reads
the catalog, validates the change against what is stored, and commits the documents and the
next version in one transaction - or starts again when another writer got there first. So two
people updating one group never lose an update, and a rule that spans documents (a live group
may not hold a judge that requires an expected answer) holds whichever side changes.

Readers take an immutable ``CatalogSnapshot``; workers keep one current through
``CatalogWatcher`` (pub/sub, plus a periodic version check as a safety net) and swap it whole,
so a trace is never scored with half of an old group and half of a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from scoring.errors import Conflict
from scoring.models import (
    AlertChannel,
    Budget,
    CustomEvaluator,
    Judge,
    MemberKind,
    Pattern,
    Scope,
    ScorerGroup,
    WireModel,
)
from scoring.stores import changes, keys

log = structlog.get_logger(__name__)

KIND_MODELS: dict[str, type[WireModel]] = {
    "judges": Judge, "patterns": Pattern, "customs": CustomEvaluator,
    "groups": ScorerGroup, "budgets": Budget, "channels": AlertChannel,
}
MEMBER_KIND_NOUN: dict[MemberKind, str] = {
    "judge": "LLM judge", "pattern": "pattern", "custom": "custom evaluator"}
WRITE_ATTEMPTS = 20


def doc_id(doc: WireModel) -> str:
    """The id a document is stored under in its kind's hash."""
    if isinstance(doc, Budget):
        return doc.project_id
    if isinstance(doc, AlertChannel):  # a project's channel is its own, even to the same URL
        return f"{doc.agent_id}|{doc.url}" if doc.project_id is None else f"{doc.project_id}|{doc.agent_id}|{doc.url}"
    return str(getattr(doc, "id"))  # noqa: B009 - every other kind has an id field


def etag(doc: WireModel) -> str:
    """A strong ETag of one stored document: it changes whenever the document does."""
    digest = hashlib.sha256(orjson.dumps(doc.stored(), option=orjson.OPT_SORT_KEYS)).hexdigest()
    return f'"{digest[:20]}"'


def kind_of(doc: WireModel) -> str:
    return next(kind for kind, model in KIND_MODELS.items() if isinstance(doc, model))


@dataclass(frozen=True)
class CatalogSnapshot:
    """The whole catalog at one version. Immutable: share it freely between tasks."""

    version: int = 0
    judges: Mapping[str, Judge] = field(default_factory=dict)
    patterns: Mapping[str, Pattern] = field(default_factory=dict)
    customs: Mapping[str, CustomEvaluator] = field(default_factory=dict)
    groups: Mapping[str, ScorerGroup] = field(default_factory=dict)
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    channels: Mapping[str, AlertChannel] = field(default_factory=dict)
    # Indexes for the hot path, built once per snapshot.
    _live: dict[tuple[str, Scope], tuple[ScorerGroup, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)
    _channels_by_agent: dict[str, tuple[AlertChannel, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        live: dict[tuple[str, Scope], list[ScorerGroup]] = {}
        for group in sorted(self.groups.values(), key=lambda g: g.id):
            if group.online is not None and group.online.enabled:
                live.setdefault((group.project_id, group.online.scope), []).append(group)
        self._live.update({k: tuple(v) for k, v in live.items()})
        by_agent: dict[str, list[AlertChannel]] = {}
        for channel in self.channels.values():
            by_agent.setdefault(channel.agent_id, []).append(channel)
        self._channels_by_agent.update({k: tuple(v) for k, v in by_agent.items()})

    # ScorerLookup, for the panel
    def judge(self, ref_id: str) -> Judge | None:
        return self.judges.get(ref_id)

    def pattern(self, ref_id: str) -> Pattern | None:
        return self.patterns.get(ref_id)

    def custom(self, ref_id: str) -> CustomEvaluator | None:
        return self.customs.get(ref_id)

    def scorer(self, kind: MemberKind, ref_id: str) -> Judge | Pattern | CustomEvaluator | None:
        return {"judge": self.judge, "pattern": self.pattern, "custom": self.custom}[kind](ref_id)

    def live_groups(self, project_id: str, scope: Scope) -> tuple[ScorerGroup, ...]:
        """The project's groups whose online profile is enabled for ``scope``."""
        return self._live.get((project_id, scope), ())

    def channels_for(self, agent_id: str, project_id: str | None = None) -> tuple[AlertChannel, ...]:
        """The agent's channels; with ``project_id``, only that project's and the shared ones (agent
        ids are the tenants' own, so two projects may both have an agent "bot")."""
        channels = self._channels_by_agent.get(agent_id, ())
        if project_id is None:
            return channels
        return tuple(c for c in channels if c.project_id in (None, project_id))

    def budget(self, project_id: str) -> Budget | None:
        return self.budgets.get(project_id)

    def with_docs(self, docs: list[WireModel]) -> CatalogSnapshot:
        """This snapshot with ``docs`` put in (for validating a change before it is written)."""
        maps: dict[str, dict[str, Any]] = {kind: dict(getattr(self, kind)) for kind in KIND_MODELS}
        for doc in docs:
            maps[kind_of(doc)][doc_id(doc)] = doc
        return CatalogSnapshot(self.version, **maps)

    def without(self, kind: str, id_: str) -> CatalogSnapshot:
        maps: dict[str, dict[str, Any]] = {k: dict(getattr(self, k)) for k in KIND_MODELS}
        maps[kind].pop(id_, None)
        return CatalogSnapshot(self.version, **maps)


# --- Rules that span documents ----------------------------------------------------------------

LABEL_MAX = 200  # a Name's length
REQUIRES_EXPECTED_LIVE = ("has requiresExpected and cannot grade live traffic; disable "
                          "requiresExpected or keep the group's live scoring off")


def group_errors(group: ScorerGroup, catalog: CatalogSnapshot, previous: ScorerGroup | None,
                 reported: Set[tuple[str, str]] = frozenset()) -> list[str]:
    """What is wrong with storing ``group`` next to ``catalog``. References that the stored
    version already held are grandfathered: their scorer may be gone, they degrade at scoring.
    ``reported``: (kind, id) of scorers whose own document was refused (already an error)."""
    grandfathered: set[tuple[str, str]] = {(m.kind, m.ref_id) for m in previous.members} if previous else set()
    grandfathered |= reported
    errors = []
    for i, member in enumerate(group.members):
        scorer = catalog.scorer(member.kind, member.ref_id)
        if scorer is not None and scorer.project_id not in (None, group.project_id):
            scorer = None  # another project's scorer: as if it did not exist
        if scorer is None and (member.kind, member.ref_id) not in grandfathered:
            errors.append(f"members[{i}].refId: no {MEMBER_KIND_NOUN[member.kind]} "
                          f"with id {member.ref_id!r}")
        elif isinstance(scorer, Judge) and scorer.requires_expected and group.live:
            errors.append(f"members[{i}].refId: judge {scorer.name!r} {REQUIRES_EXPECTED_LIVE}")
    return errors


def labelled(group: ScorerGroup, catalog: CatalogSnapshot,
             previous: ScorerGroup | None) -> tuple[ScorerGroup, list[str]]:
    """``group`` with every member labelled, and what is wrong with its labels. A label the
    user gave is kept, else the one the stored version gave the same member, else the scorer's
    name - so a member keeps its name after its scorer is renamed or deleted. New labels that
    would repeat a name get the ref id ("Quality [q-1]") so two members are never one name."""
    kept: dict[tuple[str, str], list[str]] = {}
    for m in previous.members if previous else []:
        if m.label is not None:
            kept.setdefault((m.kind, m.ref_id), []).append(m.label)
    chosen: list[str | None] = []  # given or kept labels; None: to be named from the scorer
    for m in group.members:
        reuse = kept.get((m.kind, m.ref_id))
        chosen.append(m.label if m.label is not None else (reuse.pop(0) if reuse else None))
    errors: list[str] = []
    taken: dict[str, int] = {}
    for i, label in enumerate(chosen):
        if label is None:
            continue
        if label in taken:
            errors.append(f"members[{i}].label: {label!r} is already the label of members[{taken[label]}]; "
                          "labels name members in results and gates, so each must be unique")
        taken.setdefault(label, i)
    bases = []
    for m in group.members:
        scorer = catalog.scorer(m.kind, m.ref_id)
        visible = scorer is not None and scorer.project_id in (None, group.project_id)
        bases.append(scorer.name if scorer is not None and visible else m.ref_id)
    wanted = [bases[i] for i, label in enumerate(chosen) if label is None]
    members = []
    for i, (m, label) in enumerate(zip(group.members, chosen, strict=True)):
        if label is None:
            label = bases[i]
            number = 1
            while label in taken or (number == 1 and wanted.count(label) > 1):
                suffix = f" [{m.ref_id}]" + (f" #{number}" if number > 1 else "")
                label, number = bases[i][:LABEL_MAX - len(suffix)] + suffix, number + 1
            taken[label] = i
        members.append(m.model_copy(update={"label": label}))
    return group.model_copy(update={"members": members}), errors


def judge_errors(judge: Judge, catalog: CatalogSnapshot) -> list[str]:
    """A judge changed to require an expected answer may not sit in a live group."""
    if not judge.requires_expected:
        return []
    return [f"requiresExpected: judge {judge.name!r} is a member of group {g.name!r} ({g.id}) "
            "whose live scoring is enabled; a judge that requires an expected answer cannot grade "
            "live traffic"
            for g in catalog.groups.values()
            if g.live and any(m.kind == "judge" and m.ref_id == judge.id for m in g.members)]


# --- The store --------------------------------------------------------------------------------

Write = tuple[str, str, WireModel | None]  # (kind, id, document or None to delete)


class SnapshotCache:
    """The last snapshot a process read, reused while the catalog's version is unchanged: a read
    then costs one GET instead of reading and validating every document (the HTTP API)."""

    def __init__(self) -> None:
        self.current: CatalogSnapshot | None = None


class CatalogStore:
    """``actor`` names who writes through this store, in the change log of every document;
    ``cache`` (shared by the stores of one process) makes unchanged-catalog reads cheap."""

    def __init__(self, redis: Redis, actor: str = "local", cache: SnapshotCache | None = None) -> None:
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
                    pipe.publish(keys.CATALOG_CHANNEL, after)
                    await pipe.execute()
                except WatchError:
                    continue
            log.info("catalog changed", version=after,
                     changes=[f"{'delete' if d is None else 'put'} {k}/{i}" for k, i, d in writes])
            return await self.snapshot()
        raise Conflict(f"the catalog kept changing during {WRITE_ATTEMPTS} attempts to write; try again")

    async def _watched_snapshot(self, pipe: Pipeline) -> CatalogSnapshot:
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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

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
