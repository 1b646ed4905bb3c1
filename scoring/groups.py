"""The scorer-groups surface, as the spec's SDK has it: ``list``, ``get``, ``create``,
``update`` (sparse; ``online`` merged key by key), ``delete`` and ``ratings``; plus
``sessions.scores``, the scorers' own puts and deletes, and applying a whole catalog file.

Every rule is checked against the catalog inside the write (see ``CatalogStore.write``), so a
rule holds even when two people change related documents at the same moment.
"""

from __future__ import annotations

import builtins
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis

from scoring.catalog import (
    KIND_MODELS,
    CatalogSnapshot,
    CatalogStore,
    Write,
    doc_id,
    group_errors,
    judge_errors,
    kind_of,
)
from scoring.channels import saved_channel
from scoring.errors import InvalidDocument, NotFound
from scoring.models import AlertChannel, CatalogDocument, Judge, Member, OnlineProfile, ScorerGroup, WireModel
from scoring.ratings import RatingsHistory, RatingsStore

UPDATABLE = {"name": "name", "description": "description", "members": "members", "online": "online",
             "project_id": "projectId", "projectId": "projectId"}
FULL_ONLINE_NEEDED = (
    "online: this group has no online profile to merge into; send a full online object "
    "(enabled, sampleRate, alertThreshold, severity; scope defaults to \"trace\")"
)


def _members_wire(members: Sequence[Any]) -> list[Any]:
    return [m.wire() if isinstance(m, Member) else m for m in members]


def _validated(doc: dict[str, Any]) -> ScorerGroup:
    try:
        return ScorerGroup.model_validate(doc)
    except ValidationError as exc:
        raise InvalidDocument.from_validation("scorer group", exc) from None


def _refuse(errors: list[str], what: str) -> None:
    if errors:
        raise InvalidDocument(f"invalid {what}: " + "; ".join(errors), errors=errors)


class ScorerGroups:
    """``client.monitor.scorer_groups``."""

    def __init__(self, store: CatalogStore, ratings_store: RatingsStore) -> None:
        self._store = store
        self._ratings = ratings_store

    async def list(self, project_id: str | None = None) -> builtins.list[ScorerGroup]:
        groups = (await self._store.snapshot()).groups.values()
        return sorted((g for g in groups if project_id in (None, g.project_id)), key=lambda g: g.name)

    async def get(self, group_id: str) -> ScorerGroup:
        group = (await self._store.snapshot()).groups.get(group_id)
        if group is None:
            raise NotFound(f"no scorer group with id {group_id!r}")
        return group

    async def create(self, name: str, members: Sequence[Any], description: str | None = None,
                     online: Mapping[str, Any] | OnlineProfile | None = None, *, project_id: str,
                     id: str | None = None) -> ScorerGroup:
        doc = {"id": id or f"grp_{uuid.uuid4().hex[:12]}", "name": name, "description": description,
               "projectId": project_id, "members": _members_wire(members),
               "online": online.wire() if isinstance(online, OnlineProfile) else online}
        group = _validated(doc)

        def change(catalog: CatalogSnapshot) -> list[Write]:
            if group.id in catalog.groups:
                raise InvalidDocument(f"id: a scorer group with id {group.id!r} already exists")
            _refuse(group_errors(group, catalog, previous=None), "scorer group")
            return [("groups", group.id, group)]

        await self._store.write(change)
        return group

    async def update(self, group_id: str, **fields: Any) -> ScorerGroup:
        unknown = sorted(set(fields) - set(UPDATABLE))
        if unknown:
            raise InvalidDocument(f"{unknown[0]}: not a field of a scorer group that can be updated")
        result: dict[str, ScorerGroup] = {}

        def change(catalog: CatalogSnapshot) -> list[Write]:
            stored = catalog.groups.get(group_id)
            if stored is None:
                raise NotFound(f"no scorer group with id {group_id!r}")
            doc = stored.stored()
            for key, value in fields.items():
                wire_key = UPDATABLE[key]
                if wire_key == "members":
                    value = _members_wire(value)
                elif wire_key == "online":
                    value = _merged_online(stored.online, value)
                doc[wire_key] = value
            group = _validated(doc)
            _refuse(group_errors(group, catalog, previous=stored), "scorer group")
            result["group"] = group
            return [] if group == stored else [("groups", group_id, group)]

        await self._store.write(change)
        return result["group"]

    async def delete(self, group_id: str) -> None:
        def change(catalog: CatalogSnapshot) -> list[Write]:
            if group_id not in catalog.groups:
                raise NotFound(f"no scorer group with id {group_id!r}")
            return [("groups", group_id, None)]

        await self._store.write(change)

    async def ratings(self, group_id: str, window: str = "7d") -> RatingsHistory:
        await self.get(group_id)
        try:
            return await self._ratings.history(group_id, window)
        except ValueError as exc:
            raise InvalidDocument(f"window: {exc}") from None


def _merged_online(stored: OnlineProfile | None, patch: Any) -> Any:
    """``online=None`` detaches; a patch merges key by key into the stored profile, and only
    into one: with nothing stored, the patch must be a full profile (400 otherwise)."""
    if patch is None or isinstance(patch, OnlineProfile):
        return patch.wire() if isinstance(patch, OnlineProfile) else None
    if not isinstance(patch, Mapping):
        raise InvalidDocument("online: must be an object or null")
    if stored is None:
        try:
            OnlineProfile.model_validate(patch)
        except ValidationError as exc:
            missing = [e["loc"][0] for e in exc.errors() if e["type"] == "missing"]
            if missing:
                raise InvalidDocument(f"{FULL_ONLINE_NEEDED}; missing: {', '.join(map(str, missing))}") \
                    from None
        return dict(patch)
    return {**stored.wire(), **patch}


class Sessions:
    """``client.monitor.sessions``."""

    def __init__(self, ratings_store: RatingsStore) -> None:
        self._ratings = ratings_store

    async def scores(self, session_id: str) -> list[dict[str, object]]:
        return await self._ratings.session_scores(session_id)


class Scorers:
    """Puts and deletes of judges, patterns, custom evaluators, budgets and channels."""

    def __init__(self, store: CatalogStore) -> None:
        self._store = store

    async def put(self, doc: WireModel) -> None:
        """Create or replace one document, checking the rules it shares with groups."""
        def change(catalog: CatalogSnapshot) -> list[Write]:
            if isinstance(doc, Judge):
                _refuse(judge_errors(doc, catalog), "judge")
            if isinstance(doc, ScorerGroup):
                _refuse(group_errors(doc, catalog, catalog.groups.get(doc.id)), "scorer group")
            saved = doc
            if isinstance(doc, AlertChannel):
                saved = saved_channel(doc, catalog.channels.get(doc_id(doc)), time.time())
            return [(kind_of(saved), doc_id(saved), saved)]

        await self._store.write(change)

    async def delete(self, kind: str, id_: str) -> None:
        """Delete a document. Groups that still refer to a deleted scorer keep the reference;
        it degrades at scoring time (not scored, or fail closed for a gate)."""
        if kind not in KIND_MODELS:
            raise InvalidDocument(f"kind: must be one of {', '.join(KIND_MODELS)}")

        def change(catalog: CatalogSnapshot) -> list[Write]:
            if id_ not in getattr(catalog, kind):
                raise NotFound(f"no {kind[:-1]} with id {id_!r}")
            return [(kind, id_, None)]

        await self._store.write(change)


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return len(self.created) + len(self.changed)


def parse_catalog(document: Any) -> CatalogDocument:
    try:
        return CatalogDocument.model_validate(document)
    except ValidationError as exc:
        raise InvalidDocument.from_validation("catalog file", exc) from None


async def apply_catalog(store: CatalogStore, document: CatalogDocument) -> ApplyReport:
    """Put every document of a catalog file, all or nothing; idempotent. Documents the file does
    not mention are left alone. Every error is listed; on any error nothing is written."""
    ordered: list[tuple[str, int, WireModel]] = [
        (kind, i, doc) for kind in KIND_MODELS for i, doc in enumerate(getattr(document, kind))]
    report = ApplyReport()
    now = time.time()

    def change(catalog: CatalogSnapshot) -> list[Write]:
        after = catalog.with_docs([doc for _, _, doc in ordered])
        errors: list[str] = []
        writes: list[Write] = []
        for names in (report.created, report.changed, report.unchanged):
            names.clear()  # a retried write starts its report again
        for kind, i, doc in ordered:
            if isinstance(doc, ScorerGroup):
                previous = catalog.groups.get(doc.id)
                errors += [f"groups[{i}].{e}" for e in group_errors(doc, after, previous)]
            if isinstance(doc, Judge):
                errors += [f"judges[{i}].{e}" for e in judge_errors(doc, after)]
            id_ = doc_id(doc)
            stored = getattr(catalog, kind).get(id_)
            if isinstance(doc, AlertChannel):
                doc = saved_channel(doc, stored, now)
            name = f"{kind}/{id_}"
            if stored is None:
                report.created.append(name)
            elif stored.stored() != doc.stored():
                report.changed.append(name)
            else:
                report.unchanged.append(name)
                continue
            writes.append((kind, id_, doc))
        _refuse(errors, "catalog file")
        return writes

    await store.write(change)
    return report


class MonitorClient:
    """The SDK surface in one object: ``client.scorer_groups``, ``client.sessions``, ..."""

    def __init__(self, redis: Redis) -> None:
        self.store = CatalogStore(redis)
        self.ratings_store = RatingsStore(redis)
        self.scorer_groups = ScorerGroups(self.store, self.ratings_store)
        self.sessions = Sessions(self.ratings_store)
        self.scorers = Scorers(self.store)

    async def apply(self, document: Any) -> ApplyReport:
        return await apply_catalog(self.store, parse_catalog(document))
