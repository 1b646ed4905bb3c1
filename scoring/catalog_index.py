"""What a catalog snapshot derives from its documents for the hot path - each project's live
groups, compiled filters, channels by agent, rubric revisions, document counts - built whole
once, then carried from one snapshot to the next by what changed.

At 50,000 groups a whole build costs seconds (compiling every filter's regexes is most of it),
and a catalog changes one document at a time: ``CatalogIndex.updated`` does the work of the
changed documents and of their projects, and shallow-copies the rest. Both paths produce the
same index (``tests/unit/test_catalog_delta.py`` holds them equal over random change sequences).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from scorer_groups.filters import walk
from scorer_groups.review_queues import ReviewQueue
from scoring.filters import Decide, compile_filter
from scoring.models import AlertChannel, Scope, ScorerGroup, WireModel

SCORER_KINDS = {"judge": "judges", "pattern": "patterns", "custom": "customs"}  # a member's kind: its scorers

# (kind, id) -> the document, or None once deleted: one change to a snapshot.
Changes = Mapping[tuple[str, str], WireModel | None]


def project_of(doc: WireModel) -> str | None:
    """The project a document belongs to; None for an operator's shared one."""
    project: str | None = getattr(doc, "project_id", None)
    return project


@dataclass(slots=True)
class CatalogIndex:
    live: dict[tuple[str, Scope], tuple[ScorerGroup, ...]]  # (project, scope): live groups by id
    live_any_scope: dict[str, tuple[ScorerGroup, ...]]  # project: live groups of every scope
    filters: dict[str, Decide]  # group id: its compiled online.filter
    span_filters: dict[str, tuple[Decide, int]]  # group id: its spanFilter, and its number of conditions
    channels_by_agent: dict[str, tuple[AlertChannel, ...]]
    # (agent, project or None for the operators' shared ones) -> channels: agent ids are the
    # tenants' own, so thousands of projects may share one ("support-agent"), and a result must
    # find its project's channels without a walk past every other project's.
    channels_by_owner: dict[tuple[str, str | None], tuple[AlertChannel, ...]]
    groups_by_project: dict[str, frozenset[str]]  # project: its groups' keys in the catalog (any state)
    revisions: dict[str, str]  # group id: its rubric's revision, filled as asked
    counts: Counter[tuple[str, str]]  # (kind, project): documents
    queues_by_group: dict[str, tuple[ReviewQueue, ...]]  # group id: the review queues naming it, by id

    @classmethod
    def build(cls, docs: Mapping[str, Mapping[str, WireModel]]) -> CatalogIndex:
        groups: Mapping[str, ScorerGroup] = docs["groups"]  # type: ignore[assignment]
        by_project: dict[str, set[str]] = {}
        for key, group in groups.items():
            by_project.setdefault(group.project_id, set()).add(key)
        index = cls(live={}, live_any_scope={}, filters={}, span_filters={}, channels_by_agent={},
                    channels_by_owner={}, groups_by_project={p: frozenset(ids) for p, ids in by_project.items()},
                    revisions={}, counts=Counter(), queues_by_group={})
        for group in groups.values():
            index._compile(group)
        for project in by_project:
            index._relist(project, groups)
        index._index_channels(docs["channels"].values())  # type: ignore[arg-type]
        index._index_queues(docs["queues"].values())  # type: ignore[arg-type]
        for kind, of_kind in docs.items():
            index.counts.update((kind, owner) for doc in of_kind.values()
                                if (owner := project_of(doc)) is not None)
        return index

    def updated(self, before: Mapping[str, Mapping[str, WireModel]], after: Mapping[str, Mapping[str, WireModel]],
                changes: Changes) -> CatalogIndex:
        """The index of ``after``, which is ``before`` (this index's documents) with ``changes``."""
        groups: Mapping[str, ScorerGroup] = after["groups"]  # type: ignore[assignment]
        index = CatalogIndex(live=dict(self.live), live_any_scope=dict(self.live_any_scope),
                             filters=dict(self.filters), span_filters=dict(self.span_filters),
                             channels_by_agent=self.channels_by_agent, channels_by_owner=self.channels_by_owner,
                             groups_by_project=dict(self.groups_by_project),
                             revisions=dict(self.revisions), counts=self.counts.copy(),
                             queues_by_group=self.queues_by_group)
        projects: set[str] = set()  # whose live lists change
        scorers: set[tuple[str, str]] = set()  # (kind, id) changed: the groups holding them are new revisions
        for (kind, id_), doc in changes.items():
            old = before[kind].get(id_)
            if old is not None and (project := project_of(old)) is not None:
                index.counts[(kind, project)] -= 1
                if index.counts[(kind, project)] <= 0:  # a project's count leaves with its last document
                    del index.counts[(kind, project)]
            if doc is not None and (project := project_of(doc)) is not None:
                index.counts[(kind, project)] += 1
            if kind == "groups":
                if isinstance(old, ScorerGroup):
                    index._forget(old.id)
                for group in (old, doc):
                    if isinstance(group, ScorerGroup):
                        projects.add(group.project_id)
                if isinstance(old, ScorerGroup):
                    index.groups_by_project[old.project_id] = index.groups_by_project[old.project_id] - {id_}
                if isinstance(doc, ScorerGroup):
                    index.groups_by_project[doc.project_id] = index.groups_by_project.get(
                        doc.project_id, frozenset()) | {id_}
                    index._compile(doc)
            elif kind in SCORER_KINDS.values():
                scorers.add((kind, id_))
        index.groups_by_project = {p: ids for p, ids in index.groups_by_project.items() if ids}
        for project in projects:
            index._relist(project, groups)
        if scorers:  # only groups asked for a revision (they had traffic) have one to forget
            for group_id in list(index.revisions):
                group = groups.get(group_id)
                if group is None or any((SCORER_KINDS[m.kind], m.ref_id) in scorers for m in group.members):
                    del index.revisions[group_id]
        if any(kind == "channels" for kind, _ in changes):
            index._index_channels(after["channels"].values())  # type: ignore[arg-type]
        if any(kind == "queues" for kind, _ in changes):  # a few a project: indexed again whole
            index._index_queues(after["queues"].values())  # type: ignore[arg-type]
        return index

    def revision(self, group: ScorerGroup, scorer_doc: Callable[[str, str], Any]) -> str:
        """What the group's ratings depend on, as a short hash: its members, weights, gates and
        blend, and the scorers they name - not its name, nor its online profile (who is graded,
        not how). A changed rubric is a new revision: a backfill grades past traffic again."""
        known = self.revisions.get(group.id)
        if known is None:
            scorers = [(m.kind, m.ref_id, scorer_doc(m.kind, m.ref_id)) for m in group.members]
            # Defaults left out: a field a release adds with its default is not a new revision.
            what = {"group": group.model_dump(mode="json", by_alias=True, exclude_defaults=True,
                                              exclude={"id", "name", "description", "online"}),
                    "scorers": scorers}
            known = hashlib.sha256(orjson.dumps(what, option=orjson.OPT_SORT_KEYS)).hexdigest()[:12]
            self.revisions[group.id] = known
        return known

    # --- the parts ------------------------------------------------------------------------------

    def _compile(self, group: ScorerGroup) -> None:
        """Filters compile once per group version: every group's, live or not (a backfill aims a
        group whose live scoring is off as it would be aimed live)."""
        online = group.online
        if online is None:
            return
        if online.filter is not None:
            self.filters[group.id] = compile_filter(online.filter)
        if online.scope == "span" and online.span_filter is not None:
            self.span_filters[group.id] = (compile_filter(online.span_filter), len(walk(online.span_filter)))

    def _forget(self, group_id: str) -> None:
        self.filters.pop(group_id, None)
        self.span_filters.pop(group_id, None)
        self.revisions.pop(group_id, None)

    def _relist(self, project: str, groups: Mapping[str, ScorerGroup]) -> None:
        """The project's live groups, by scope and in id order, from its groups now."""
        for scope in ("session", "span", "trace"):
            self.live.pop((project, scope), None)
        live: dict[Scope, list[ScorerGroup]] = {}
        for group in sorted((groups[key] for key in self.groups_by_project.get(project, ())), key=lambda g: g.id):
            if group.online is not None and group.online.enabled:
                live.setdefault(group.online.scope, []).append(group)
        self.live.update({(project, scope): tuple(of_scope) for scope, of_scope in live.items()})
        every = tuple(g for scope in sorted(live) for g in live[scope])
        if every:
            self.live_any_scope[project] = every
        else:
            self.live_any_scope.pop(project, None)

    def _index_channels(self, channels: Iterable[AlertChannel]) -> None:
        by_agent: dict[str, list[AlertChannel]] = {}
        by_owner: dict[tuple[str, str | None], list[AlertChannel]] = {}
        for channel in channels:
            by_agent.setdefault(channel.agent_id, []).append(channel)
            by_owner.setdefault((channel.agent_id, channel.project_id), []).append(channel)
        self.channels_by_agent = {agent: tuple(of_agent) for agent, of_agent in by_agent.items()}
        self.channels_by_owner = {owner: tuple(of_owner) for owner, of_owner in by_owner.items()}

    def _index_queues(self, queues: Iterable[ReviewQueue]) -> None:
        by_group: dict[str, list[ReviewQueue]] = {}
        for queue in sorted(queues, key=lambda q: q.id):
            for group_id in queue.group_ids:
                by_group.setdefault(group_id, []).append(queue)
        self.queues_by_group = {group_id: tuple(of_group) for group_id, of_group in by_group.items()}
