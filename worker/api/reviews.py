"""``/v1/review-queues``: where people check the judges on live traffic. A thin shell
around ``services.review_queues`` - the rules hold the same through ``catalog apply``."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request, Response

from adapters.stores.datasets import DatasetStore
from scorer_groups.api_models import JudgeCallRecord
from scorer_groups.review_queues import (
    AddedItems,
    AddItems,
    ItemPage,
    ItemView,
    LabelBody,
    Labelled,
    LiveAgreement,
    QueueCounts,
    ReviewOrigin,
    ReviewProgress,
    ReviewQueue,
)
from scorer_groups.runs import Dataset
from scoring.catalog import etag
from scoring.models import ID_PATTERN, Id, Name, WireModel
from services.review_queues import ReviewQueues
from worker.api.auth import Client, Who, redis_of
from worker.api.door import for_reviewers
from worker.api.evaluations import QUOTA_REFUSED, storage_of
from worker.api.groups import GroupId, IfMatch
from worker.api.pages import Cursor, Limit, OffsetCursor, Page, page
from worker.api.problems import Problem

router = APIRouter(prefix="/v1", tags=["review queues"])
QueueId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]
# An item's id: its queue's id, ":", a uuid (scoring.review_rules.review_item_id).
ItemId = Annotated[str, Path(alias="id", max_length=200, pattern=r"^[^/\x00-\x1f\x7f-\x9f]+:[0-9a-f-]{36}$")]


class RulePatch(WireModel):
    """Keys to merge into the stored rule; a key sent as null is cleared."""

    below: bool | None = None
    disagreement: float | None = None
    sample_rate: float | None = None


class QueueCreate(WireModel):
    """A new queue. ``projectId`` is the key's project (an operator key names one)."""

    name: Name
    group_ids: list[Id]
    rule: dict[str, Any]  # validated whole with the queue (its errors say rule.sampleRate, ...)
    origins: list[ReviewOrigin] | None = None
    reviewers_per_item: int | None = None
    reservation_seconds: int | None = None
    capacity: int | None = None
    keep_days: int | None = None
    max_bytes: int | None = None
    project_id: Id | None = None


class QueuePatch(WireModel):
    """A sparse update: only the fields sent change; ``rule`` merges key by key."""

    name: Name | None = None
    group_ids: list[Id] | None = None
    rule: RulePatch | None = None
    origins: list[ReviewOrigin] | None = None
    reviewers_per_item: int | None = None
    reservation_seconds: int | None = None
    capacity: int | None = None
    keep_days: int | None = None
    max_bytes: int | None = None


class QueuePage(Page):
    items: list[ReviewQueue]


def queues(client: Client, who: Who) -> ReviewQueues:
    return ReviewQueues(client.store, who)


Queues = Annotated[ReviewQueues, Depends(queues)]


def _with_etag(response: Response, queue: ReviewQueue) -> ReviewQueue:
    response.headers["ETag"] = etag(queue)
    return queue


@router.get("/review-queues", response_model=QueuePage, openapi_extra=for_reviewers())
async def list_queues(surface: Queues, limit: Limit = 50, cursor: Cursor = None) -> QueuePage:
    items, next_cursor = page(await surface.list(), lambda q: q.id, limit, cursor)
    return QueuePage(items=items, next_cursor=next_cursor)


@router.post("/review-queues", status_code=201, response_model=ReviewQueue)
async def create_queue(body: QueueCreate, surface: Queues, request: Request, response: Response) -> ReviewQueue:
    fields = body.model_dump(by_alias=True, exclude_none=True, exclude={"project_id"})
    queue = await surface.create(fields, project_id=body.project_id)
    response.headers["Location"] = str(request.url_for("get_queue", id=queue.id).path)
    return _with_etag(response, queue)


@router.get("/review-queues/{id}", response_model=ReviewQueue, openapi_extra=for_reviewers())
async def get_queue(queue_id: QueueId, surface: Queues, response: Response) -> ReviewQueue:
    return _with_etag(response, await surface.get(queue_id))


@router.patch("/review-queues/{id}", response_model=ReviewQueue)
async def update_queue(queue_id: QueueId, body: QueuePatch, surface: Queues, response: Response,
                       if_match: IfMatch = None) -> ReviewQueue:
    fields: dict[str, Any] = {}
    for name in body.model_fields_set:
        wire = QueuePatch.model_fields[name].alias or name
        value = getattr(body, name)
        if name == "rule" and isinstance(value, RulePatch):
            value = value.model_dump(by_alias=True, exclude_unset=True)
        fields[wire] = value
    return _with_etag(response, await surface.update(queue_id, fields, if_match=if_match))


@router.delete("/review-queues/{id}", status_code=204, response_class=Response)
async def delete_queue(queue_id: QueueId, surface: Queues, if_match: IfMatch = None) -> Response:
    await surface.delete(queue_id, if_match=if_match)
    return Response(status_code=204)


@router.get("/review-queues/{id}/items", response_model=ItemPage)
async def queue_items(queue_id: QueueId, surface: Queues, limit: Limit = 50, cursor: OffsetCursor = None,
                      state: Annotated[Literal["open", "all"], Query(
                          description="open: the open items, oldest first (the order people review them in); "
                                      "all: every item kept, newest first")] = "open") -> ItemPage:
    items, next_cursor, counts = await surface.items(queue_id, state=state, limit=limit, cursor=int(cursor or 0))
    return ItemPage(items=items, next_cursor=None if next_cursor is None else str(next_cursor),
                    counts=QueueCounts(open=counts["open"], taken=counts["taken"], turned_away=counts["turnedAway"]))


@router.post("/review-queues/{id}/items", response_model=AddedItems)
async def add_items(queue_id: QueueId, body: AddItems, surface: Queues) -> AddedItems:
    """Put results in the queue by hand (up to 100 rating ids at a time, from one group's latest
    results - the console's results list): reason "added". They carry the verdicts and the judge
    calls the results list keeps, not the trace's texts. Adding a result again changes nothing."""
    return await surface.add(queue_id, body.rating_ids, time.time(), group_id=body.group_id)


@router.get("/review-queues/{id}/progress", response_model=ReviewProgress, openapi_extra=for_reviewers())
async def queue_progress(queue_id: QueueId, surface: Queues) -> ReviewProgress:
    """Where this key stands in the queue: open items now, items done, items it labelled."""
    return await surface.progress(queue_id)


@router.post("/review-queues/{id}/next", response_model=ItemView, openapi_extra=for_reviewers(),
             responses={204: {"description": "No open item for this key now."}})
async def next_item(queue_id: QueueId, surface: Queues) -> Any:
    """Reserve for this key the oldest open item nobody else holds that it has not labelled
    (``reservationSeconds``; the item goes back when that runs out) - or the item it already
    holds: asking again takes no second item."""
    view = await surface.next(queue_id)
    return Response(status_code=204) if view is None else view


@router.get("/review-items/{id}", response_model=ItemView, openapi_extra=for_reviewers())
async def get_item(item_id: ItemId, surface: Queues) -> ItemView:
    """An item with its state and labels; to a reviewer key, an item it holds or labelled, with
    its own label only (people label independently)."""
    return await surface.view(item_id)


@router.get("/review-items/{id}/calls", response_model=list[JudgeCallRecord], openapi_extra=for_reviewers())
async def item_calls(item_id: ItemId, surface: Queues) -> list[JudgeCallRecord]:
    """The judge calls behind an item's result (the exact messages each judge read and its
    answer, cut and masked), while the group's latest results keep them; to a reviewer key, of
    an item it holds or labelled."""
    return await surface.calls(item_id)


@router.put("/review-items/{id}/labels/me", response_model=Labelled, openapi_extra=for_reviewers(),
            responses={503: {"model": Problem, "description": "No Redis replica acknowledged the label in time: "
                                                               "it is not promised kept; send it again."}})
async def label_item(item_id: ItemId, body: LabelBody, surface: Queues) -> Labelled:
    """This key's label of an item it holds - or its label changed, while the item is open.
    Answered once a Redis replica holds it too (where there are replicas)."""
    label, done = await surface.label(item_id, body, time.time())
    return Labelled(label=label, done=done)


@router.get("/scorer-groups/{id}/agreement", response_model=LiveAgreement, tags=["scorer groups"])
async def group_agreement(group_id: GroupId, surface: Queues) -> LiveAgreement:
    """The group's and each judge member's agreement with people over the labelled review items
    of its results, as labels come in (Spearman, Cohen's kappa at the gate mark and the alert
    threshold, MAE, with the number of items behind each), and between reviewers where two
    labelled the same item."""
    return await surface.agreement(group_id)


class ExportBody(WireModel):
    """Where the labelled items go: a new version of ``dataset`` (one of the project's), or a new
    dataset named ``name`` (the queue's name by default)."""

    dataset: Id | None = None
    name: Name | None = None


@router.post("/review-queues/{id}/export", status_code=201, response_model=Dataset, responses=QUOTA_REFUSED)
async def export_queue(queue_id: QueueId, body: ExportBody, surface: Queues, who: Who, request: Request,
                       response: Response) -> Dataset:
    """A dataset version of the queue's labelled items (up to 10,000, oldest first): ``input``, the
    answer as ``output``, ``humanRating`` the reviewers' median - ready for ``grade`` (its
    agreement figures) and CI gates. Counted against the project's dataset quotas."""
    queue = await surface.get(queue_id)
    rows = await surface.export_rows(queue_id)
    store = DatasetStore(redis_of(request))
    adding = sum(len(row.model_dump_json(by_alias=True)) for row in rows)
    storage = storage_of(request)
    if body.dataset is not None:
        async with storage.reserved(queue.project_id, "version", adding) as reservation:
            return await store.add_version(queue.project_id, body.dataset, rows, reservation=reservation)
    async with storage.reserved(queue.project_id, "dataset", adding) as reservation:
        dataset = await store.create(queue.project_id, body.name or queue.name, rows,
                                     description=f"Labelled items of review queue {queue.id}", reservation=reservation)
    response.headers["Location"] = str(request.url_for("get_dataset", id=dataset.id).path)
    return dataset
