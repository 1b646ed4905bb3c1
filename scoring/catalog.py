"""The catalog as the scoring core sees it: an immutable snapshot of every document at one
version, and the rules that span documents (a live group may not hold a judge that requires an
expected answer; members are labelled once and keep their labels).

Pure: no Redis. ``adapters.stores.catalog`` keeps the documents in Redis and hands out snapshots.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Any

import orjson

from scorer_groups.review_queues import ReviewQueue
from scoring.catalog_index import CatalogIndex, Changes
from scoring.filters import Decide, HeaderView, View, regex_errors
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

KIND_MODELS: dict[str, type[WireModel]] = {
    "judges": Judge, "patterns": Pattern, "customs": CustomEvaluator,
    "groups": ScorerGroup, "budgets": Budget, "channels": AlertChannel, "queues": ReviewQueue,
}
MEMBER_KIND_NOUN: dict[MemberKind, str] = {
    "judge": "LLM judge", "pattern": "pattern", "custom": "custom evaluator"}


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
    queues: Mapping[str, ReviewQueue] = field(default_factory=dict)
    # What the hot path reads, derived from the documents: built whole for a snapshot read whole,
    # carried from the previous one by ``changed`` (scoring.catalog_index).
    index: CatalogIndex = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.index is None:
            object.__setattr__(self, "index", CatalogIndex.build(self._docs()))

    def _docs(self) -> dict[str, Mapping[str, WireModel]]:
        return {kind: getattr(self, kind) for kind in KIND_MODELS}

    def changed(self, changes: Changes, version: int | None = None) -> CatalogSnapshot:
        """This snapshot with ``changes`` ((kind, id) -> the document, or None to delete), at
        ``version`` (this one's if not given): the cost of the changed documents and of their
        projects' groups, not of the catalog."""
        maps: dict[str, dict[str, Any]] = {}
        for (kind, id_), doc in changes.items():
            if kind not in maps:
                maps[kind] = dict(getattr(self, kind))
            if doc is None:
                maps[kind].pop(id_, None)
            else:
                maps[kind][id_] = doc
        after = {kind: maps.get(kind, getattr(self, kind)) for kind in KIND_MODELS}
        return CatalogSnapshot(self.version if version is None else version, **after,
                               index=self.index.updated(self._docs(), after, changes))

    # ScorerLookup, for the panel
    def judge(self, ref_id: str) -> Judge | None:
        return self.judges.get(ref_id)

    def pattern(self, ref_id: str) -> Pattern | None:
        return self.patterns.get(ref_id)

    def custom(self, ref_id: str) -> CustomEvaluator | None:
        return self.customs.get(ref_id)

    def scorer(self, kind: MemberKind, ref_id: str) -> Judge | Pattern | CustomEvaluator | None:
        return {"judge": self.judge, "pattern": self.pattern, "custom": self.custom}[kind](ref_id)

    def revision(self, group: ScorerGroup) -> str:
        """What the group's ratings depend on (``CatalogIndex.revision``)."""
        return self.index.revision(group, self._scorer_doc)  # type: ignore[arg-type]

    def _scorer_doc(self, kind: MemberKind, ref_id: str) -> dict[str, Any] | None:
        scorer = self.scorer(kind, ref_id)
        return None if scorer is None else scorer.model_dump(mode="json", by_alias=True, exclude_defaults=True,
                                                             exclude={"name"})

    def live_groups(self, project_id: str, scope: Scope) -> tuple[ScorerGroup, ...]:
        """The project's groups whose online profile is enabled for ``scope``."""
        return self.index.live.get((project_id, scope), ())

    def live_groups_of(self, project_id: str) -> tuple[ScorerGroup, ...]:
        """The project's live groups of every scope."""
        return self.index.live_any_scope.get(project_id, ())

    def passes(self, group: ScorerGroup, view: View) -> bool | None:
        """Does the trace (or what its headers tell) pass the group's filter? None: cannot tell."""
        decide = self.index.filters.get(group.id)
        return True if decide is None else decide(view)

    def span_filter(self, group: ScorerGroup) -> tuple[Decide, int] | None:
        """A span-scope group's compiled ``spanFilter`` and its number of conditions."""
        return self.index.span_filters.get(group.id)

    def wanted(self, project_id: str, view: HeaderView) -> bool:
        """Might a live group of the project (any scope) want the record these headers describe?
        False only when every one of them is sure not to: the record need not be parsed."""
        return any(self.passes(group, view) is not False for group in self.live_groups_of(project_id))

    def channels_for(self, agent_id: str, project_id: str | None = None) -> tuple[AlertChannel, ...]:
        """The agent's channels; with ``project_id``, only that project's and the shared ones (agent
        ids are the tenants' own, so two projects may both have an agent "bot")."""
        if project_id is None:
            return self.index.channels_by_agent.get(agent_id, ())
        owned = self.index.channels_by_owner
        return owned.get((agent_id, project_id), ()) + owned.get((agent_id, None), ())

    def queues_watching(self, group_id: str) -> tuple[ReviewQueue, ...]:
        """The review queues that name the group (``scoring.review_rules`` decides which take a result)."""
        return self.index.queues_by_group.get(group_id, ())

    def budget(self, project_id: str) -> Budget | None:
        return self.budgets.get(project_id)

    def with_docs(self, docs: list[WireModel]) -> CatalogSnapshot:
        """This snapshot with ``docs`` put in (for validating a change before it is written)."""
        return self.changed({(kind_of(doc), doc_id(doc)): doc for doc in docs})

    def without(self, kind: str, id_: str) -> CatalogSnapshot:
        return self.changed({(kind, id_): None})

    def count(self, kind: str, project_id: str) -> int:
        """How many documents of ``kind`` the project has (its quota counts them)."""
        return self.index.counts.get((kind, project_id), 0)

    def project_groups(self, project_id: str) -> list[ScorerGroup]:
        """The project's groups (any state), by id."""
        return sorted((self.groups[key] for key in self.index.groups_by_project.get(project_id, ())),
                      key=lambda g: g.id)


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
    errors = (regex_errors(group.online.filter) + regex_errors(group.online.span_filter, "online.spanFilter")
              if group.online is not None else [])
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


MAX_QUEUES_PER_GROUP = 10  # a result's items are one copy per queue that takes it: bounded per group


def queue_errors(queue: ReviewQueue, catalog: CatalogSnapshot, previous: ReviewQueue | None) -> list[str]:
    """A queue watches groups of its own project. An id the stored version already held is kept
    (its group was deleted or moved since: the queue takes nothing from it)."""
    held = set(previous.group_ids) if previous is not None else set()
    errors = []
    for i, group_id in enumerate(queue.group_ids):
        group = catalog.groups.get(group_id)
        if (group is None or group.project_id != queue.project_id) and group_id not in held:
            errors.append(f"groupIds[{i}]: no scorer group with id {group_id!r} in project {queue.project_id!r}")
        others = [q for q in catalog.queues_watching(group_id) if q.id != queue.id]
        if group_id not in held and len(others) >= MAX_QUEUES_PER_GROUP:
            errors.append(f"groupIds[{i}]: group {group_id!r} is watched by {len(others)} review queues already, "
                          f"the most a group may have ({MAX_QUEUES_PER_GROUP}): each queue keeps its own copy "
                          "of every result it takes")
    return errors


def judge_errors(judge: Judge, catalog: CatalogSnapshot) -> list[str]:
    """A judge changed to require an expected answer may not sit in a live group."""
    if not judge.requires_expected:
        return []
    return [f"requiresExpected: judge {judge.name!r} is a member of group {g.name!r} ({g.id}) "
            "whose live scoring is enabled; a judge that requires an expected answer cannot grade "
            "live traffic"
            for g in catalog.groups.values()
            if g.live and any(m.kind == "judge" and m.ref_id == judge.id for m in g.members)]
