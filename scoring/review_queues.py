"""``client.review_queues``: a project's review queues (issue 55), kept in the catalog beside the
groups they watch - so every worker has them in its snapshot, and a queue's change costs one
document. The same rules whichever way a change arrives (API, SDK, ``catalog apply``): the
wire model's limits, and ``scoring.catalog.queue_errors`` (a queue watches its own project's
groups). A PATCH merges like a group's: the fields sent replace the stored ones, and ``rule``
merges key by key (``null`` clears a key).
"""

from __future__ import annotations

import builtins
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.catalog import CatalogSnapshot, queue_errors
from scoring.errors import InvalidDocument
from scoring.groups import Caller
from scoring.stores.catalog import CatalogStore, Write
from scoring.stores.review_items import ReviewItems

# What a PATCH may change (the id and the project stay: a queue's items are its project's).
UPDATABLE = ("name", "groupIds", "rule", "origins", "reviewersPerItem", "reservationSeconds", "capacity",
             "keepDays")


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
        await self.get(queue_id)  # 404 unless the caller's project sees the queue
        items, next_cursor = await self._items.page(queue_id, state=state, limit=limit, cursor=cursor)
        # Each item by its own project: a queue id reused by another project shows none of the old.
        return ([i for i in items if self._caller.operator or i.project_id == self._caller.project_id], next_cursor,
                await self._items.counts(queue_id))

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
        def change(catalog: CatalogSnapshot) -> list[Write]:
            self._caller.writable("queues", catalog, queue_id, if_match)
            return [("queues", queue_id, None)]

        await self._store.write(change)


def _refuse(errors: builtins.list[str]) -> None:
    if errors:
        raise InvalidDocument.of(errors)
