"""Which offsets may be committed: per partition, the lowest offset not yet finished.

Traces finish out of order (a judge is slow on one, quick on the next), but Kafka commits one
position per partition, meaning "everything before this is done". So the tracker remembers the
offsets in flight and commits up to the oldest of them; a crash redelivers only what was not
finished, and nothing finished is ever skipped.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition

log = structlog.get_logger(__name__)


@dataclass
class _Partition:
    pending: set[int] = field(default_factory=set)
    heap: list[int] = field(default_factory=list)  # pending offsets, lazily cleaned
    next_offset: int | None = None  # one past the highest offset seen
    committed: int | None = None


class OffsetTracker:
    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, _Partition] = {}

    def started(self, tp: TopicPartition, offset: int) -> None:
        p = self._partitions.setdefault(tp, _Partition())
        p.pending.add(offset)
        heapq.heappush(p.heap, offset)
        p.next_offset = max(p.next_offset or 0, offset + 1)

    def finished(self, tp: TopicPartition, offset: int) -> None:
        p = self._partitions.get(tp)
        if p is not None:  # a partition revoked meanwhile is no longer ours to commit
            p.pending.discard(offset)

    def in_flight(self) -> int:
        return sum(len(p.pending) for p in self._partitions.values())

    def committable(self, tp: TopicPartition) -> int | None:
        """The offset to commit for ``tp``: the oldest pending one, or one past the last seen."""
        p = self._partitions.get(tp)
        if p is None or p.next_offset is None:
            return None
        while p.heap and p.heap[0] not in p.pending:
            heapq.heappop(p.heap)
        return p.heap[0] if p.heap else p.next_offset

    def to_commit(self) -> dict[TopicPartition, int]:
        """Partitions whose committable offset moved since the last commit."""
        moves = {}
        for tp, p in self._partitions.items():
            offset = self.committable(tp)
            if offset is not None and offset != p.committed:
                moves[tp] = offset
        return moves

    def committed(self, offsets: dict[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            if tp in self._partitions:
                self._partitions[tp].committed = offset

    def forget(self, partitions: set[TopicPartition] | list[TopicPartition]) -> None:
        for tp in partitions:
            self._partitions.pop(tp, None)

    def partitions(self) -> list[TopicPartition]:
        return list(self._partitions)


class CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    """Before partitions move to another consumer, commit what is finished on them and stop
    tracking them. Work still in flight on them goes on; for traces, its leases make the new
    owner wait instead of scoring twice."""

    def __init__(self, commit: Callable[[set[TopicPartition]], Awaitable[None]],
                 on_assigned: Callable[[set[TopicPartition]], None] | None = None,
                 tracker: OffsetTracker | None = None) -> None:
        self._commit = commit
        self._on_assigned = on_assigned
        self._tracker = tracker

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        try:
            await self._commit(set(revoked))
        except Exception:
            log.warning("commit on revocation failed; the new owner may redeliver", exc_info=True)
        if self._tracker is not None:
            self._tracker.forget(set(revoked))
        log.info("partitions revoked", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        if self._on_assigned is not None:
            self._on_assigned(set(assigned))
        log.info("partitions assigned", partitions=sorted(f"{tp.topic}:{tp.partition}" for tp in assigned))
