"""The scorer-groups surface as the spec's SDK has it: list, get, create, update, delete, ratings.

Also ``sessions.scores``, the scorers' own puts and deletes, and applying a whole catalog file. The one
rule: every rule is checked against the catalog inside the write (``CatalogStore.write``), and a ``Caller``
scopes the surface - another project's documents are "not found", never "forbidden". More:
docs/design-notes.md.
"""

from __future__ import annotations

import builtins
import dataclasses
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from adapters.stores.catalog import CatalogLimits, CatalogStore, SnapshotCache, Write
from adapters.stores.catalog_file import ApplyReport, apply_file
from adapters.stores.channels import saved_channel
from adapters.stores.claims import Claims
from adapters.stores.client import RedisClient
from adapters.stores.ratings import RatingsHistory, RatingsStore
from scorer_groups.api_models import BudgetUse, BudgetView, JudgeCallRecord, RatingWithCalls, ResultsPage
from scorer_groups.documents import Rating
from scoring.catalog import (
    KIND_MODELS,
    CatalogSnapshot,
    doc_id,
    etag,
    group_errors,
    judge_errors,
    kind_of,
    labelled,
)
from scoring.errors import Forbidden, InvalidDocument, NotFound, PreconditionFailed
from scoring.models import AlertChannel, Budget, Judge, Member, OnlineProfile, ScorerGroup, WireModel
from scoring.prices import NANOS

UPDATABLE = {"name": "name", "description": "description", "members": "members", "online": "online",
             "project_id": "projectId", "projectId": "projectId", "gates_first": "gatesFirst",
             "gatesFirst": "gatesFirst"}
# Cursors are ASCII digits ([0-9], not \d: that takes any script's digits, and int() with them)
_RESULTS_CURSOR = re.compile(r"[0-9]{1,20}")  # the place of a result in its group's latest results
_STREAM_CURSOR = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")  # what versions before the list gave (a stream entry id)
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
        raise InvalidDocument.from_validation(exc) from None


def _refuse(errors: list[str]) -> None:
    if errors:
        raise InvalidDocument.of(errors)


SHARED_KINDS = ("judges", "patterns", "customs")  # kinds an operator may share with every project
KIND_NOUN = {"judges": "judge", "patterns": "pattern", "customs": "custom evaluator",
             "groups": "scorer group", "budgets": "budget", "channels": "alert channel", "queues": "review queue"}


@dataclass(frozen=True)
class Caller:
    """Who is asking: ``project_id`` None is an operator (every project); ``actor`` names them in
    the change log."""

    project_id: str | None = None
    actor: str = "local"
    # The key's id and name (a reviewer's labels carry them) and role (worker.api.door keeps a
    # reviewer key to the review routes).
    key_id: str = ""
    name: str = "local"
    role: str = "admin"

    @property
    def operator(self) -> bool:
        return self.project_id is None

    def sees(self, kind: str, doc: WireModel) -> bool:
        owner = getattr(doc, "project_id", None)
        return self.operator or owner == self.project_id or (owner is None and kind in SHARED_KINDS)

    def found(self, kind: str, catalog: CatalogSnapshot, id_: str) -> WireModel:
        """The document ``id_`` if the caller may see it; else NotFound, whether it exists or not."""
        doc: WireModel | None = getattr(catalog, kind).get(id_)
        if doc is None or not self.sees(kind, doc):
            raise NotFound(f"no {KIND_NOUN[kind]} with id {id_!r}")
        return doc

    def writable(self, kind: str, catalog: CatalogSnapshot, id_: str, if_match: str | None) -> WireModel:
        doc = self.found(kind, catalog, id_)
        if not self.operator and getattr(doc, "project_id", None) != self.project_id:
            raise Forbidden(f"{KIND_NOUN[kind]} {id_!r} is shared by the operators; a project can use it "
                            "in its groups but not change it")
        check_if_match(if_match, doc)
        return doc

    def project_for(self, requested: str | None) -> str:
        """The project a new document goes to: the caller's own; an operator must name one."""
        if self.project_id is None:
            if requested is None:
                raise InvalidDocument("projectId: required (an operator key acts on any project, so "
                                      "name the one this document belongs to)")
            return requested
        if requested not in (None, self.project_id):
            raise InvalidDocument(f"projectId: this key belongs to project {self.project_id!r} and "
                                  "cannot write to another project")
        return self.project_id


def budget_write(caller: Caller, sent: Budget, stored: Budget | None) -> Budget:
    """What a budget PUT stores. The operators set the budget (the judge endpoint's bill is
    theirs); the project's own key may only lower it:

    1. an operator's figures replace the operators' own; the window and the project's lower
       caps are kept unless the operator sends them too;
    2. a project's ``judgeCallsPerWindow`` / ``judgeTokensPerWindow`` / ``judgeCostPerWindow``
       become its own caps - at most the operators' figures - and it cannot change the window or
       create a budget."""
    if caller.operator:
        kept = {} if stored is None else {f: getattr(stored, f) for f in KEPT_UNLESS_SENT
                                          if f not in sent.model_fields_set}
        return sent.model_copy(update=kept)
    if stored is None:
        raise Forbidden(f"project {sent.project_id!r} has no budget; the operators set budgets, and a project "
                        "key may only lower one")
    for name in sorted(sent.model_fields_set & set(KEPT_UNLESS_SENT[1:])):
        wire = Budget.model_fields[name].alias or name
        raise Forbidden(f"{wire}: a project key sets its own cap by sending judgeCallsPerWindow, "
                        "judgeTokensPerWindow and judgeCostPerWindow")
    if "window_seconds" in sent.model_fields_set and sent.window_seconds != stored.window_seconds:
        raise Forbidden(f"windowSeconds: the operators set the window ({stored.window_seconds} s); a project "
                        "key may only lower its caps")
    if sent.judge_calls_per_window > stored.judge_calls_per_window:
        raise Forbidden(f"judgeCallsPerWindow: {sent.judge_calls_per_window} is above the operators' cap of "
                        f"{stored.judge_calls_per_window}; a project key may only lower its budget")
    tokens = sent.judge_tokens_per_window
    if tokens is not None and stored.judge_tokens_per_window is not None and tokens > stored.judge_tokens_per_window:
        raise Forbidden(f"judgeTokensPerWindow: {tokens} is above the operators' cap of "
                        f"{stored.judge_tokens_per_window}; a project key may only lower its budget")
    cost = sent.judge_cost_per_window
    if cost is not None and stored.judge_cost_per_window is not None and cost > stored.judge_cost_per_window:
        raise Forbidden(f"judgeCostPerWindow: {cost:g} is above the operators' cap of "
                        f"{stored.judge_cost_per_window:g}; a project key may only lower its budget")
    return stored.model_copy(update={"project_judge_calls_per_window": sent.judge_calls_per_window,
                                     "project_judge_tokens_per_window": tokens,
                                     "project_judge_cost_per_window": cost})


KEPT_UNLESS_SENT = ("window_seconds", "project_judge_calls_per_window", "project_judge_tokens_per_window",
                    "project_judge_cost_per_window")


def check_if_match(if_match: str | None, doc: WireModel) -> None:
    """``If-Match``: ``*`` or a list of ETags, one of which must be the document's current one."""
    if if_match is None or if_match.strip() == "*":
        return
    current = etag(doc)
    sent = [tag.strip().removeprefix("W/") for tag in if_match.split(",")]
    if current not in sent:
        raise PreconditionFailed(f"If-Match: the document changed since that version was read "
                                 f"(current ETag {current}); read it again and retry")


class ScorerGroups:
    """``client.monitor.scorer_groups``."""

    def __init__(self, store: CatalogStore, ratings_store: RatingsStore, caller: Caller | None = None) -> None:
        self._store = store
        self._ratings = ratings_store
        self._caller = caller or Caller()

    async def list(self, project_id: str | None = None) -> builtins.list[ScorerGroup]:
        snapshot = await self._store.snapshot()
        project_id = self._caller.project_id or project_id
        # A project's groups from the snapshot's index: a tenant's list costs its own groups.
        groups = snapshot.groups.values() if project_id is None else snapshot.project_groups(project_id)
        return sorted(groups, key=lambda g: g.name)

    async def get(self, group_id: str) -> ScorerGroup:
        group = self._caller.found("groups", await self._store.snapshot(), group_id)
        assert isinstance(group, ScorerGroup)
        return group

    async def results(self, group_id: str, *, limit: int = 50, cursor: str | None = None,
                      below: bool = False) -> ResultsPage:
        """The group's latest results, newest first (``below``: only those under its alert
        threshold); the last ``keys.RESULTS_KEPT`` are kept."""
        await self.get(group_id)  # 404 unless the caller's project sees the group
        if cursor is not None and _STREAM_CURSOR.fullmatch(cursor):
            # Given by a version that kept results in a stream, before a deploy: its pages ended.
            return ResultsPage(items=[], next_cursor=None)
        if cursor is not None and not _RESULTS_CURSOR.fullmatch(cursor):
            raise InvalidDocument("cursor: not a cursor this API gave (nextCursor of the page before)")
        documents, next_cursor = await self._ratings.results(group_id, limit=limit, cursor=cursor, below=below)
        # Each result by its own project (``_sees``): a moved group's list keeps its old project's
        # results until newer ones push them out. A page may then hold fewer than ``limit``.
        ratings = [Rating.model_validate_json(d) for d in documents]
        return ResultsPage(items=[r for r in ratings if self._sees(r)], next_cursor=next_cursor)

    async def result(self, group_id: str, rating_id: str) -> RatingWithCalls:
        """One of the group's latest results by its rating id, with its judge calls; NotFound
        once the latest results no longer keep it (or for another project's group)."""
        await self.get(group_id)  # 404 unless the caller's project sees the group
        found = await self._ratings.result(group_id, rating_id)
        if found is None:
            raise NotFound(f"no result {rating_id!r} among the latest results of group {group_id!r}")
        document, calls = found
        rating = Rating.model_validate_json(document)
        if not self._sees(rating):
            raise NotFound(f"no result {rating_id!r} among the latest results of group {group_id!r}")
        return RatingWithCalls(rating=rating,
                               calls=[JudgeCallRecord.model_validate(c) for c in orjson.loads(calls or b"[]")])

    def _sees(self, rating: Rating) -> bool:
        """Whether the caller may read the result: by its own project, not only the group's now -
        a group moved to another project (or an id reused) must not show the new owner the old
        one's traces, which results and their calls quote."""
        return self._caller.operator or rating.project_id == self._caller.project_id

    async def create(self, name: str, members: Sequence[Any], description: str | None = None,
                     online: Mapping[str, Any] | OnlineProfile | None = None, *, project_id: str | None = None,
                     id: str | None = None, gates_first: bool = False) -> ScorerGroup:
        doc = {"id": id or f"grp_{uuid.uuid4().hex[:12]}", "name": name, "description": description,
               "projectId": self._caller.project_for(project_id), "members": _members_wire(members),
               "online": online.wire() if isinstance(online, OnlineProfile) else online, "gatesFirst": gates_first}
        given = _validated(doc)
        result: dict[str, ScorerGroup] = {}

        def change(catalog: CatalogSnapshot) -> list[Write]:
            if given.id in catalog.groups:
                raise InvalidDocument(f"id: a scorer group with id {given.id!r} already exists")
            group, label_errors = labelled(given, catalog, previous=None)
            _refuse(group_errors(group, catalog, previous=None) + label_errors)
            result["group"] = group
            return [("groups", group.id, group)]

        await self._store.write(change)
        return result["group"]

    async def update(self, group_id: str, *, if_match: str | None = None, **fields: Any) -> ScorerGroup:
        unknown = sorted(set(fields) - set(UPDATABLE))
        if unknown:
            raise InvalidDocument(f"{unknown[0]}: not a field of a scorer group that can be updated")
        result: dict[str, ScorerGroup] = {}

        def change(catalog: CatalogSnapshot) -> list[Write]:
            stored = self._caller.writable("groups", catalog, group_id, if_match)
            assert isinstance(stored, ScorerGroup)
            doc = stored.stored()
            for key, value in fields.items():
                wire_key = UPDATABLE[key]
                if wire_key == "members":
                    value = _members_wire(value)
                elif wire_key == "online":
                    value = _merged_online(stored.online, value)
                elif wire_key == "projectId" and value != stored.project_id:
                    value = self._caller.project_for(value)
                doc[wire_key] = value
            group, label_errors = labelled(_validated(doc), catalog, previous=stored)
            _refuse(group_errors(group, catalog, previous=stored) + label_errors)
            result["group"] = group
            return [] if group == stored else [("groups", group_id, group)]

        await self._store.write(change)
        return result["group"]

    async def delete(self, group_id: str, *, if_match: str | None = None) -> None:
        def change(catalog: CatalogSnapshot) -> list[Write]:
            self._caller.writable("groups", catalog, group_id, if_match)
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

    def __init__(self, ratings_store: RatingsStore, store: CatalogStore | None = None,
                 caller: Caller | None = None) -> None:
        self._ratings = ratings_store
        self._store = store
        self._caller = caller or Caller()

    async def scores(self, session_id: str) -> list[dict[str, object]]:
        """The latest verdict of each group on the session; a project sees its own groups' only
        (session ids are the tenants' own, so two projects may use the same one)."""
        verdicts = await self._ratings.session_scores(session_id)
        if self._caller.operator or self._store is None:
            return verdicts
        groups = (await self._store.snapshot()).groups
        prefix = len("scorer-group:")
        return [v for v in verdicts if (g := groups.get(str(v["kind"])[prefix:])) is not None
                and g.project_id == self._caller.project_id]


class Scorers:
    """Puts and deletes of judges, patterns, custom evaluators, budgets and channels."""

    def __init__(self, store: CatalogStore, caller: Caller | None = None, claims: Claims | None = None) -> None:
        self._store = store
        self._caller = caller or Caller()
        self._claims = claims or Claims(store.redis)

    async def list(self, kind: str) -> builtins.list[WireModel]:
        """The documents of ``kind`` the caller may see, by id."""
        docs = getattr(await self._store.snapshot(), _kind(kind))
        return [doc for _, doc in sorted(docs.items()) if self._caller.sees(kind, doc)]

    async def get(self, kind: str, id_: str) -> WireModel:
        return self._caller.found(_kind(kind), await self._store.snapshot(), id_)

    async def budget_use(self, project_id: str, now: float | None = None) -> BudgetView:
        """The project's budget and what its current window has used (calls, tokens, money)."""
        budget = self._caller.found("budgets", await self._store.snapshot(), project_id)
        assert isinstance(budget, Budget)
        now = time.time() if now is None else now
        window = budget.window_seconds
        calls = await self._claims.budget_used(project_id, window, now)
        tokens = await self._claims.tokens_used(project_id, window, now)
        saved_calls, saved_tokens = await self._claims.saved(project_id, window, now)
        cost = await self._claims.cost_used(project_id, window, now) / NANOS if budget.cost_cap is not None else None
        use = BudgetUse(window_start=int(now) // window * window, window_seconds=window, judge_calls=calls,
                        judge_tokens=tokens, judge_calls_saved=saved_calls, judge_tokens_saved=saved_tokens,
                        judge_cost=cost)
        return BudgetView.model_validate({**budget.stored(), "used": use.model_dump(by_alias=True)})

    async def put(self, doc: WireModel, *, if_match: str | None = None, create: bool = False) -> WireModel:
        """Create or replace one document, checking the rules it shares with groups; answers the
        document as saved. ``create`` refuses an id that is taken. A project's caller writes only
        documents of its project."""
        kind, id_ = kind_of(doc), doc_id(doc)
        written: list[WireModel] = []

        def change(catalog: CatalogSnapshot) -> list[Write]:
            if id_ in getattr(catalog, kind):
                if create:  # the same answer whoever owns it: an id is just unavailable
                    raise InvalidDocument(f"id: {id_!r} is already taken; choose another")
                self._caller.writable(kind, catalog, id_, if_match)
            elif if_match is not None and if_match.strip() != "*":
                raise PreconditionFailed("If-Match: the document does not exist (any more)")
            if not self._caller.operator:
                self._caller.project_for(getattr(doc, "project_id", None) or "")
            if isinstance(doc, Judge):
                _refuse(judge_errors(doc, catalog))
            saved = doc
            if isinstance(doc, ScorerGroup):
                saved, label_errors = labelled(doc, catalog, catalog.groups.get(doc.id))
                _refuse(group_errors(saved, catalog, catalog.groups.get(doc.id)) + label_errors)
            if isinstance(saved, AlertChannel):
                saved = saved_channel(saved, catalog.channels.get(doc_id(saved)), time.time())
            if isinstance(saved, Budget):
                saved = budget_write(self._caller, saved, catalog.budgets.get(id_))
            written[:] = [saved]
            return [(kind_of(saved), doc_id(saved), saved)]

        await self._store.write(change)
        return written[0]

    async def delete(self, kind: str, id_: str, *, if_match: str | None = None) -> None:
        """Delete a document. Groups that still refer to a deleted scorer keep the reference;
        it degrades at scoring time (not scored, or fail closed for a gate)."""
        kind = _kind(kind)

        def change(catalog: CatalogSnapshot) -> list[Write]:
            self._caller.writable(kind, catalog, id_, if_match)
            if kind == "budgets" and not self._caller.operator:
                raise Forbidden("a project key cannot delete its budget (that would lift its cap); "
                                "the operators set budgets - lower yours with a PUT instead")
            return [(kind, id_, None)]

        await self._store.write(change)


def _kind(kind: str) -> str:
    if kind not in KIND_MODELS:
        raise InvalidDocument(f"kind: must be one of {', '.join(KIND_MODELS)}")
    return kind


class MonitorClient:
    """The SDK surface in one object: ``client.scorer_groups``, ``client.sessions``, ..."""

    def __init__(self, redis: RedisClient, caller: Caller | None = None, cache: SnapshotCache | None = None,
                 limits: CatalogLimits | None = None) -> None:
        caller = caller or Caller()
        limits = limits or CatalogLimits()
        if caller.operator:  # a project's documents of each kind are bounded; the operators' are not
            limits = dataclasses.replace(limits, docs_per_kind=None)
        self.store = CatalogStore(redis, actor=caller.actor, cache=cache, limits=limits,
                                  writer=caller.project_id or "")
        self.ratings_store = RatingsStore(redis)
        self.scorer_groups = ScorerGroups(self.store, self.ratings_store, caller)
        self.sessions = Sessions(self.ratings_store, self.store, caller)
        self.scorers = Scorers(self.store, caller, Claims(redis))

    async def apply(self, document: Any) -> ApplyReport:
        """Apply a catalog file (see adapters.stores.catalog_file): every error listed, all or nothing."""
        return await apply_file(self.store, document)
