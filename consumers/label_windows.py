"""The windows of labels the agreement watch judges (``consumers.incidents``): for each
group of this worker's share that a review queue of its project watches, its newest labelled items - done, every
label given - newest first, each once (a result in two queues is one item, its labels together).

Read each tick, in two steps:

1. one round trip asks every relevant queue when its newest item was done;
2. only the queues with an item done since the last read are read again (their newest
   ``READ_PER_QUEUE`` done items, two round trips): labels come when people work, so most ticks
   read nothing but step 1, whatever the number of labelled items kept.
"""

from __future__ import annotations

from adapters.stores.review_items import ReviewItems
from consumers.fleet_share import FleetShare
from scorer_groups.review_queues import ReviewQueue, ScoreCard
from scoring.catalog import CatalogSnapshot
from scoring.incidents import AGREEMENT_WINDOW

# A queue watching several groups holds them mixed: read this many of its newest done items for
# every group to find its own window in them.
READ_PER_QUEUE = 4 * AGREEMENT_WINDOW

LabelledRow = tuple[float, ScoreCard, dict[str, dict[str, object]]]  # (done at, the machine's, labels)


class LabelWindows:
    def __init__(self, items: ReviewItems, share: FleetShare) -> None:
        self._items, self._share = items, share
        self._read: dict[tuple[str, str], tuple[float, list[LabelledRow]]] = {}  # queue -> (its newest done, rows)

    async def read(self, snapshot: CatalogSnapshot) -> dict[str, list[LabelledRow]]:
        """Each watched group's newest labelled items (up to ``AGREEMENT_WINDOW``), newest first."""
        queues = [q for q in snapshot.queues.values() if any(self._share.owns(g) for g in q.group_ids)]
        newest = await self._items.newest_done(queues)  # 1.
        stale = [(q, at) for q, at in zip(queues, newest, strict=True)
                 if at and self._read.get(_key(q), (0.0, []))[0] != at]
        fresh = await self._items.recent_labelled([q for q, _ in stale], READ_PER_QUEUE)  # 2.
        for (queue, at), rows in zip(stale, fresh, strict=True):
            self._read[_key(queue)] = (at, rows)
        kept = {_key(q) for q, at in zip(queues, newest, strict=True) if at}
        self._read = {k: v for k, v in self._read.items() if k in kept}  # deleted, emptied, handed over

        by_rating: dict[str, dict[str, LabelledRow]] = {}
        for queue in queues:
            for at, card, labels in self._read.get(_key(queue), (0.0, []))[1]:
                group = snapshot.groups.get(card.group_id)
                if (group is None or group.project_id != queue.project_id or card.group_id not in queue.group_ids
                        or not self._share.owns(card.group_id)):
                    continue  # gone, moved to another project, no longer watched, another worker's
                of_group = by_rating.setdefault(card.group_id, {})
                seen = of_group.get(card.rating_id)
                if seen is None:
                    of_group[card.rating_id] = (at, card, dict(labels))
                else:  # the same result in another queue: one item, its labels together
                    seen[2].update(labels)
                    of_group[card.rating_id] = (max(seen[0], at), card, seen[2])
        return {group_id: sorted(of_group.values(), key=lambda row: -row[0])[:AGREEMENT_WINDOW]
                for group_id, of_group in by_rating.items()}


def _key(queue: ReviewQueue) -> tuple[str, str]:
    return queue.project_id, queue.id
