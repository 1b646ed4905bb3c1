"""``client.review_queues``: a project's review queues, kept in the catalog beside the
groups they watch - so every worker has them in its snapshot, and a queue's change costs one
document. The same rules whichever way a change arrives (API, SDK, ``catalog apply``): the
wire model's limits, and ``scoring.catalog.queue_errors`` (a queue watches its own project's
groups). A PATCH merges like a group's: the fields sent replace the stored ones, and ``rule``
merges key by key (``null`` clears a key).
"""

from __future__ import annotations

import builtins
import statistics
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError

from adapters.stores.catalog import CatalogStore, Write
from adapters.stores.ratings import RatingsStore
from adapters.stores.review_items import LabelRefused, ReviewItems
from scorer_groups.api_models import JudgeCallRecord
from scorer_groups.documents import Rating
from scorer_groups.review_queues import (
    AddedItems,
    ItemView,
    LabelBody,
    LiveAgreement,
    ReviewItem,
    ReviewLabel,
    ReviewProgress,
    ReviewQueue,
)
from scorer_groups.runs import DatasetItem
from scoring.catalog import CatalogSnapshot, queue_errors
from scoring.errors import Conflict, InvalidDocument, NotFound
from scoring.models import ScorerGroup
from scoring.review_agreement import live_agreement
from scoring.review_rules import added_item, queue_of_item
from services.groups import Caller

EXPORT_MAX_ROWS = 10_000  # a dataset version's rows from one export (the oldest labelled items)

# What a PATCH may change (the id and the project stay: a queue's items are its project's).
UPDATABLE = ("name", "groupIds", "rule", "origins", "reviewersPerItem", "reservationSeconds", "capacity",
             "keepDays", "maxBytes")


def _validated(doc: dict[str, Any]) -> ReviewQueue:
    try:
        return ReviewQueue.model_validate(doc)
    except ValidationError as exc:
        raise InvalidDocument.from_validation(exc) from None


class ReviewQueues:
    def __init__(self, store: CatalogStore, caller: Caller | None = None) -> None:
        self._store = store
        self._caller = caller or Caller()
        self._items = ReviewItems(store.redis)

    async def list(self) -> builtins.list[ReviewQueue]:
        snapshot = await self._store.snapshot()
        return sorted((q for q in snapshot.queues.values() if self._caller.sees("queues", q)), key=lambda q: q.name)

    async def get(self, queue_id: str) -> ReviewQueue:
        queue = self._caller.found("queues", await self._store.snapshot(), queue_id)
        assert isinstance(queue, ReviewQueue)
        return queue

    async def items(self, queue_id: str, *, state: str = "open", limit: int = 50,
                    cursor: int = 0) -> tuple[builtins.list[ReviewItem], int | None, dict[str, int]]:
        """A page of the queue's items - open ones oldest first, or all newest first - with its
        counts (open now, taken, turned away at capacity)."""
        queue = await self.get(queue_id)  # 404 unless the caller's project sees the queue
        items, next_cursor = await self._items.page(queue, state=state, limit=limit, cursor=cursor)
        return ([i for i in items if i.project_id == queue.project_id], next_cursor, await self._items.counts(queue))

    async def create(self, fields: Mapping[str, Any], *, project_id: str | None = None) -> ReviewQueue:
        """``fields``: the queue's wire fields but its id and project (the caller's)."""
        doc = {**fields, "id": f"rq_{uuid.uuid4().hex[:12]}", "projectId": self._caller.project_for(project_id)}
        given = _validated(doc)

        def change(catalog: CatalogSnapshot) -> list[Write]:
            _refuse(queue_errors(given, catalog, previous=None))
            return [("queues", given.id, given)]

        await self._store.write(change)
        return given

    async def update(self, queue_id: str, fields: Mapping[str, Any], *, if_match: str | None = None) -> ReviewQueue:
        unknown = sorted(set(fields) - set(UPDATABLE))
        if unknown:
            raise InvalidDocument(f"{unknown[0]}: not a field of a review queue that can be updated")
        result: dict[str, ReviewQueue] = {}

        def change(catalog: CatalogSnapshot) -> list[Write]:
            stored = self._caller.writable("queues", catalog, queue_id, if_match)
            assert isinstance(stored, ReviewQueue)
            doc = stored.stored()
            for key, value in fields.items():
                if value is None:  # a null puts the field's default back (or names a required one)
                    doc.pop(key, None)
                    continue
                if key == "rule" and isinstance(value, Mapping):  # key by key; a null puts its default back
                    value = {k: v for k, v in {**stored.rule.wire(), **value}.items() if v is not None}
                doc[key] = value
            queue = _validated(doc)
            _refuse(queue_errors(queue, catalog, previous=stored))
            result["queue"] = queue
            return [] if queue == stored else [("queues", queue_id, queue)]

        await self._store.write(change)
        return result["queue"]

    async def delete(self, queue_id: str, *, if_match: str | None = None) -> None:
        """The queue, and its items and labels with it (every label version is on the labels topic)."""
        deleted: dict[str, ReviewQueue] = {}

        def change(catalog: CatalogSnapshot) -> list[Write]:
            stored = self._caller.writable("queues", catalog, queue_id, if_match)
            assert isinstance(stored, ReviewQueue)
            deleted["queue"] = stored
            return [("queues", queue_id, None)]

        await self._store.write(change)
        await self._items.forget(deleted["queue"])

    async def progress(self, queue_id: str) -> ReviewProgress:
        queue = await self.get(queue_id)
        return ReviewProgress(**await self._items.progress(queue, self._caller.key_id))

    async def add(self, queue_id: str, rating_ids: builtins.list[str], now: float,
                  group_id: str | None = None) -> AddedItems:
        """Put results in the queue by hand (reason "added"): rating ids among the latest results
        of one group it watches (``group_id``; implied when it watches one). They carry what the
        results list keeps of them - the verdicts, and the judge calls (what the judges read) at
        ``/v1/review-items/{id}/calls`` - not the trace's texts, which only a rule deciding at
        publish time holds. A result already in the queue stays as it is; a full queue turns
        items away, as for the rule's."""
        queue = await self.get(queue_id)
        if group_id is None:
            if len(queue.group_ids) != 1:
                raise InvalidDocument("groupId: required - the queue watches several groups "
                                      f"({', '.join(queue.group_ids)})")
            group_id = queue.group_ids[0]
        if group_id not in queue.group_ids:
            raise InvalidDocument(f"groupId: the queue does not watch group {group_id!r} "
                                  f"(it watches {', '.join(queue.group_ids)})")
        wanted = list(dict.fromkeys(rating_ids))
        found = await RatingsStore(self._store.redis).results_by_id(group_id, wanted)
        items = []
        for document, _calls in found.values():
            rating = Rating.model_validate_json(document)
            if rating.project_id == queue.project_id and rating.group_id == group_id:  # not a reused id's
                items.append((added_item(queue, rating), queue))
        taken = await self._items.take(items, now) if items else []
        added, away = (taken[0].taken, taken[0].turned_away) if taken else (0, 0)
        kept = {item.rating_id for item, _ in items}
        return AddedItems(added=added, already=len(items) - added - away, turned_away=away,
                          missing=[r for r in wanted if r not in kept])

    # --- the review: a reviewer takes the next item and labels it ------------------------------

    async def next(self, queue_id: str) -> ItemView | None:
        """Reserve for the caller the item they hold, else the oldest open item nobody else holds
        that they have not labelled; None when there is none for them now."""
        queue = await self.get(queue_id)
        found = await self._items.next(queue, self._caller.key_id)  # the server's clock
        if found is None:
            return None
        view = await self.view(found[0])
        return view.model_copy(update={"reserved_until": datetime.fromtimestamp(found[1], UTC)})

    async def view(self, item_id: str) -> ItemView:
        """An item of the caller's project. A reviewer sees an item they hold or labelled, and only
        their own label: people label independently (their agreement is measured)."""
        queue = await self.get(queue_of_item(item_id))  # 404 for another project's queue
        found = await self._items.view(queue, item_id)
        if found is None or found[0].project_id != queue.project_id:
            raise NotFound(f"no review item with id {item_id!r}")
        item, done, labels, held = found
        reviewer = self._caller.role == "reviewer"
        mine = self._caller.key_id
        if reviewer and mine not in labels and (held is None or held[0] != mine):
            raise NotFound(f"no review item with id {item_id!r} held or labelled by this key")
        shown = [ReviewLabel.model_validate(label) for key, label in sorted(labels.items())
                 if not reviewer or key == mine]
        until = datetime.fromtimestamp(held[1], UTC) if held is not None and held[0] == mine else None
        return ItemView(item=item, state="done" if done else "open", labels=shown, reserved_until=until)

    async def calls(self, item_id: str) -> builtins.list[JudgeCallRecord]:
        """The judge calls behind the item's result, to whoever may see the item (``view``);
        none once the group's latest results no longer keep them."""
        item = (await self.view(item_id)).item
        found = await RatingsStore(self._store.redis).result(item.group_id, item.rating_id)
        if found is None or Rating.model_validate_json(found[0]).project_id != item.project_id:
            return []
        return [JudgeCallRecord.model_validate(c) for c in orjson.loads(found[1] or b"[]")]

    async def label(self, item_id: str, body: LabelBody, now: float) -> tuple[ReviewLabel, bool]:
        """Keep the caller's label of the item: they hold it, or change their label while it is
        open. Returns the label as kept and whether the item is done by it."""
        queue = await self.get(queue_of_item(item_id))
        found = await self._items.view(queue, item_id)
        if found is None or found[0].project_id != queue.project_id:
            raise NotFound(f"no review item with id {item_id!r}")
        item = found[0]
        refs = [m.ref_id for m in item.rating.members]
        for ref in body.members:
            if ref not in refs:
                raise InvalidDocument(f"members.{ref}: not a member of this result (its members: "
                                      f"{', '.join(refs) or 'none'})")
        label = ReviewLabel(item_id=item.id, queue_id=queue.id, project_id=item.project_id, group_id=item.group_id,
                            rating_id=item.rating_id, reviewer=self._caller.name, reviewer_key=self._caller.key_id,
                            rating=body.rating, members=body.members, comment=body.comment,
                            labelled_at=datetime.fromtimestamp(now, UTC))
        try:
            done = await self._items.label(queue, item_id, self._caller.key_id, label.to_json())
        except LabelRefused as refused:
            if refused.why == "missing":  # gone since it was read (past keepDays)
                raise NotFound(f"no review item with id {item_id!r}") from None
            raise Conflict({"not_held": "take the item first (POST /v1/review-queues/{id}/next): it is not "
                                        "reserved for this key, or its reservation ran out",
                            "done": "the item has all its labels and is done"}[refused.why]) from None
        return label.model_copy(update={"version": done.version}), done.done

    async def agreement(self, group_id: str) -> LiveAgreement:
        """The group's judges against people, over the labelled items of its results in every
        queue of its project that watches it (a result in two queues: one row, its labels together)."""
        snapshot = await self._store.snapshot()
        group = self._caller.found("groups", snapshot, group_id)
        assert isinstance(group, ScorerGroup)
        rows: dict[str, tuple[Any, dict[str, Any]]] = {}
        for queue in snapshot.queues_watching(group_id):
            if queue.project_id != group.project_id:
                continue
            for card, labels in await self._items.labelled(queue):
                if card.group_id != group_id:
                    continue
                kept = rows.setdefault(card.rating_id, (card, {}))
                kept[1].update(labels)
        return live_agreement(group, list(rows.values()))

    async def export_rows(self, queue_id: str, limit: int = EXPORT_MAX_ROWS) -> builtins.list[DatasetItem]:
        """The queue's labelled items as dataset rows, oldest first: the request as ``input``, the
        answer as ``output``, ``humanRating`` the median of the reviewers' ratings, and where each
        came from in ``metadata`` - rows ``grade`` reads as they are (its agreement figures)."""
        queue = await self.get(queue_id)
        rows = []
        for item, labels in await self._items.labelled_items(queue, limit):
            if not labels or item.project_id != queue.project_id or not (item.subject.transcript or item.subject.input):
                continue  # an item added by hand carries no texts: nothing to grade again
            subject = item.subject
            rows.append(DatasetItem(
                input=subject.transcript or subject.input, output=subject.output,
                human_rating=statistics.median(float(label["rating"]) for label in labels.values()),  # type: ignore[arg-type]
                metadata={"itemId": item.id, "ratingId": item.rating_id, "groupId": item.group_id,
                          "traceId": subject.trace_id, "sessionId": subject.session_id, "spanId": subject.span_id,
                          "labels": len(labels)}))
        return rows


def _refuse(errors: builtins.list[str]) -> None:
    if errors:
        raise InvalidDocument.of(errors)
