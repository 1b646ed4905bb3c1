"""A catalog file (``scorer-worker catalog apply``): every document of every kind, put all or
nothing, idempotent.

A file is checked whole before anything is written, and every error is listed at once, each
naming its document (``groups[1] "release"``) and field: a document the models refuse, a group
member whose ``refId`` names nothing, a ``requiresExpected`` judge in a live group, a repeated
member label. Refs to a document of the same file that was itself refused are not reported a
second time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from adapters.stores.catalog import CatalogStore, Write
from adapters.stores.channels import saved_channel
from scorer_groups.review_queues import ReviewQueue
from scoring.catalog import (
    KIND_MODELS,
    CatalogSnapshot,
    doc_id,
    group_errors,
    judge_errors,
    labelled,
    queue_errors,
)
from scoring.errors import InvalidDocument, field_errors
from scoring.models import AlertChannel, Judge, Member, OnlineProfile, ScorerGroup, WireModel

MEMBER_KIND = {"judges": "judge", "patterns": "pattern", "customs": "custom"}


@dataclass
class ApplyReport:
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return len(self.created) + len(self.changed)


@dataclass
class CatalogFile:
    """The documents of a file the models accept, in file order, and what was refused."""

    documents: list[tuple[str, int, WireModel]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    refused: set[tuple[str, str]] = field(default_factory=set)  # (member kind, id) of refused scorers
    refused_groups: list[tuple[int, Mapping[str, Any]]] = field(default_factory=list)


def _named(kind: str, index: int, raw: Any) -> str:
    """``groups[1] "release"``: where a document is in the file, and what it is called."""
    ident = None
    if isinstance(raw, Mapping):
        ident = raw.get("id") or raw.get("projectId") or raw.get("agentId")
    elif isinstance(raw, WireModel):
        ident = doc_id(raw)
    return f"{kind}[{index}]" + (f" {str(ident)[:80]!r}" if ident else "")


def parse_file(document: Any) -> CatalogFile:
    """Each document validated on its own, so one bad document hides no other error."""
    parsed = CatalogFile()
    if not isinstance(document, Mapping):
        parsed.errors.append(f"(file): must be a mapping of {', '.join(KIND_MODELS)} to lists of documents")
        return parsed
    for key in document:
        if key not in KIND_MODELS:
            parsed.errors.append(f"{key}: not a kind of document (kinds: {', '.join(KIND_MODELS)})")
    for kind, model in KIND_MODELS.items():
        raws = document.get(kind) or []
        if not isinstance(raws, list):
            parsed.errors.append(f"{kind}: must be a list of documents")
            continue
        for i, raw in enumerate(raws):
            try:
                parsed.documents.append((kind, i, model.model_validate(raw)))
            except ValidationError as exc:
                parsed.errors += [f"{_named(kind, i, raw)}: {e}" for e in field_errors(exc)]
                if kind in MEMBER_KIND and isinstance(raw, Mapping) and isinstance(raw.get("id"), str):
                    parsed.refused.add((MEMBER_KIND[kind], raw["id"].strip()))
                if kind == "groups" and isinstance(raw, Mapping):
                    parsed.refused_groups.append((i, raw))
    return parsed


def _refused_group_errors(index: int, raw: Mapping[str, Any], after: CatalogSnapshot,
                          refused: set[tuple[str, str]]) -> list[str]:
    """The ref and rule errors of a group the models refused: each member that is valid on its
    own is checked as if the rest of the group were, so fixing the schema reveals nothing new."""
    project = str(raw.get("projectId") or "")
    try:
        online = OnlineProfile.model_validate(raw.get("online")) if raw.get("online") is not None else None
    except ValidationError:
        online = None
    members = raw.get("members")
    if not isinstance(members, list):
        return []
    errors = []
    for j, member_raw in enumerate(members):
        try:
            member = Member.model_validate(member_raw)
        except ValidationError:
            continue  # already reported by the model
        probe = ScorerGroup.model_construct(id="", name="", project_id=project, members=[member],
                                            online=online, description=None)
        errors += [f"{_named('groups', index, raw)}: members[{j}]{e.removeprefix('members[0]')}"
                   for e in group_errors(probe, after, None, refused)]
    return errors


def _file_order(error: str) -> tuple[int, int]:
    """Errors in the order of the file: by kind, then by document (a stable sort keeps the rest)."""
    kind, _, rest = error.partition("[")
    position = rest.split("]", 1)[0]
    kinds = list(KIND_MODELS)
    place = int(position) if position.isascii() and position.isdigit() else -1
    return (kinds.index(kind) if kind in kinds else -1, place)


async def apply_file(store: CatalogStore, document: Any) -> ApplyReport:
    """Put every document of a catalog file, all or nothing; idempotent. Documents the file does
    not mention are left alone. Every error is listed; on any error nothing is written."""
    parsed = parse_file(document)
    report = ApplyReport()
    now = time.time()

    def change(catalog: CatalogSnapshot) -> list[Write]:
        after = catalog.with_docs([doc for _, _, doc in parsed.documents])
        errors = list(parsed.errors)
        writes: list[Write] = []
        for names in (report.created, report.changed, report.unchanged):
            names.clear()  # a retried write starts its report again
        for kind, i, doc in parsed.documents:
            id_ = doc_id(doc)
            stored = getattr(catalog, kind).get(id_)
            if isinstance(doc, ScorerGroup):
                previous = catalog.groups.get(doc.id)
                doc, label_errors = labelled(doc, after, previous)
                errors += [f"{_named(kind, i, doc)}: {e}"
                           for e in group_errors(doc, after, previous, parsed.refused) + label_errors]
            if isinstance(doc, Judge):
                errors += [f"{_named(kind, i, doc)}: {e}" for e in judge_errors(doc, after)]
            if isinstance(doc, ReviewQueue):
                errors += [f"{_named(kind, i, doc)}: {e}" for e in queue_errors(doc, after, catalog.queues.get(id_))]
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
        for i, raw in parsed.refused_groups:
            errors += _refused_group_errors(i, raw, after, parsed.refused)
        if errors:
            errors.sort(key=_file_order)
            raise InvalidDocument("invalid catalog file: " + "; ".join(errors), errors=errors)
        return writes

    await store.write(change)
    return report
