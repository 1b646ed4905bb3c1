"""The labels' exporter: every version of every review label goes on the labels topic, for the team's warehouse.

The one rule: a label leaves its queue's outbox only after the broker acknowledged it (at-least-once: a
consumer dedupes on the item, reviewer key and version). The tick's steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import orjson
import structlog

from adapters.stores.keys import LABELS_SWEEP_S
from adapters.stores.review_items import QueueRef, ReviewItems
from consumers.fleet_share import FleetShare
from consumers.periodic import Send, every
from scoring.catalog import CatalogSnapshot
from scoring.outbox import Record

log = structlog.get_logger(__name__)


class LabelExporter:
    def __init__(self, *, items: ReviewItems, catalog: Callable[[], CatalogSnapshot], send: Send, topic: str,
                 share: FleetShare | None = None, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._items, self._catalog, self._send, self._topic = items, catalog, send, topic
        self._share = share or FleetShare.everything()
        self._interval_s, self._clock = interval_s, clock
        self._swept_at: float | None = None
        self.exported = 0  # label versions sent, for tests and logs

    async def run(self, stop: asyncio.Event) -> None:
        await every(self._interval_s, self.tick, stop, name="exporting review labels")

    async def tick(self) -> None:
        snapshot = self._catalog()  # (a failed tick: the outbox keeps the labels for the next)
        if self._swept_at is None or self._clock() - self._swept_at >= LABELS_SWEEP_S:  # 4.
            mine = [q for q in snapshot.queues.values() if self._share.owns(q.id)]
            await self._items.mark_unexported(mine, time.time())
            self._swept_at = self._clock()
        for queue in await self._items.pending_queues():  # 1. (a deleted queue's outbox left with it;
            if self._share.owns(queue.id):  # one an operator moved to another project still goes out)
                await self._export(queue)

    async def _export(self, queue: QueueRef) -> None:
        while versions := await self._items.outbox(queue):  # 2.
            records = []
            for _, label in versions:
                item_id = _item_of(label)
                records.append(Record(self._topic, item_id.encode() if item_id else None, label))
            await self._send(records)
            await self._items.exported(queue, [entry_id for entry_id, _ in versions])  # 3.
            self.exported += len(versions)
        await self._items.settle(queue)


def _item_of(label: bytes) -> str | None:
    """The item a label version is keyed by on the topic (its ``itemId``)."""
    try:
        value = orjson.loads(label).get("itemId")
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None
