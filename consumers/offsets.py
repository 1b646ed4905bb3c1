"""Which offsets may be committed, and the one commit path of the loops that read topics.

Traces finish out of order (a judge is slow on one, quick on the next), but Kafka commits one
position per partition, meaning "everything before this is done". So the tracker remembers the
offsets in flight and commits up to the oldest of them; a crash redelivers only what was not
finished, and nothing finished is ever skipped. ``Committer`` is how the traces, webhooks and
OTLP loops commit: on an interval, and for partitions about to be revoked (``CommitOnRevoke``).
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata

log = structlog.get_logger(__name__)


@dataclass(eq=False)
class PartitionOffsets:
    """One partition's offsets under one assignment. ``started`` hands it out as the ticket a
    job finishes with: once the partition is revoked (and perhaps assigned back) the ticket
    belongs to a forgotten object, so a late finish can never mark the new owner's work done."""

    pending: set[int] = field(default_factory=set)
    heap: list[int] = field(default_factory=list)  # pending offsets, lazily cleaned
    next_offset: int | None = None  # one past the highest offset seen
    committed: int | None = None

    def finished(self, offset: int) -> None:
        self.pending.discard(offset)

    def committable(self) -> int | None:
        """The oldest pending offset, or one past the last seen when nothing is pending."""
        if self.next_offset is None:
            return None
        while self.heap and self.heap[0] not in self.pending:
            heapq.heappop(self.heap)
        return self.heap[0] if self.heap else self.next_offset


class OffsetTracker:
    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, PartitionOffsets] = {}

    def started(self, tp: TopicPartition, offset: int) -> PartitionOffsets:
        p = self._partitions.setdefault(tp, PartitionOffsets())
        p.pending.add(offset)
        heapq.heappush(p.heap, offset)
        p.next_offset = max(p.next_offset or 0, offset + 1)
        return p

    def in_flight(self) -> int:
        return sum(len(p.pending) for p in self._partitions.values())

    def committable(self, tp: TopicPartition) -> int | None:
        p = self._partitions.get(tp)
        return None if p is None else p.committable()

    def to_commit(self) -> dict[TopicPartition, int]:
        """Partitions whose committable offset moved since the last commit."""
        moves = {}
        for tp, p in self._partitions.items():
            offset = p.committable()
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


class CommitOnRevoke(ConsumerRebalanceListener):  # type: ignore[misc]
    """Before partitions move to another consumer, commit what is finished on them and stop
    tracking them. Work still in flight on them goes on; for traces, its leases make the new
    owner wait instead of scoring twice."""

    def __init__(self, commit: Callable[[set[TopicPartition]], Awaitable[Any]],
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


COMMIT_TIMEOUT_S = 10.0  # a commit is one request to the coordinator; past this it is away


class CommitTimedOut(KafkaError):  # type: ignore[misc]  # aiokafka ships no types
    """A commit that got no answer in time: retried on the next tick, like any failed commit."""

    retriable = True


class Committer:
    """The loops' one commit path. ``commit`` commits, per partition tracked, the offset below
    which everything is finished (``tracker``), when it moved; the
    loop calls it when ``due`` (every ``interval_s``), at the end, and - through ``listener`` -
    for partitions about to be revoked, which the tracker then forgets. Returns what moved."""

    def __init__(self, consumer: Any, interval_s: float) -> None:
        self.tracker = OffsetTracker()
        self.interval_s = interval_s
        self._consumer = consumer
        self._last = 0.0

    @property
    def due(self) -> bool:
        return time.monotonic() - self._last >= self.interval_s

    async def commit(self, only: set[TopicPartition] | None = None) -> dict[TopicPartition, int]:
        self._last = time.monotonic()
        moves = {tp: offset for tp, offset in self.tracker.to_commit().items() if only is None or tp in only}
        if moves:
            try:
                # aiokafka waits for the group's coordinator without end (seen: over 80 s after a
                # broker restart): a loop waiting in a commit neither turns nor stops. A commit
                # that takes longer is a failed one, which the callers already ride out.
                await asyncio.wait_for(self._consumer.commit(
                    {tp: OffsetAndMetadata(offset, "") for tp, offset in moves.items()}), COMMIT_TIMEOUT_S)
            except TimeoutError:
                raise CommitTimedOut(f"no answer to the offset commit within {COMMIT_TIMEOUT_S:g}s "
                                     "(the group's coordinator unknown or away)") from None
            self.tracker.committed(moves)
        return moves

    def listener(self, commit: Callable[[set[TopicPartition]], Awaitable[Any]] | None = None,
                 on_assigned: Callable[[set[TopicPartition]], None] | None = None) -> CommitOnRevoke:
        """The rebalance listener: ``commit`` (default: this one's) for revoked partitions."""
        return CommitOnRevoke(commit or (lambda revoked: self.commit(only=revoked)), on_assigned, self.tracker)
