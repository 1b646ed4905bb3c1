"""The offset tracker under any interleaving a consumer can produce (hypothesis state machine).

The model plays the broker and the loop around ``consumers.offsets.OffsetTracker``: partitions
are assigned (fetching resumes at the broker's committed offset) and revoked (commit what is
finished, then forget - or the commit fails and is simply lost), records are fetched in order
and started, jobs finish in any order - including jobs of a revoked assignment that finish
late - and commits run in two halves, as in ``TracesLoop.commit``: the offsets are read, then
the broker's answer comes back after anything else may have happened.

Invariants, after every step:
- a committed offset never passes a record that was fetched and that no delivery of it has
  finished (at-least-once: a crash then redelivers it);
- it never passes what was fetched at all;
- within one assignment, what the tracker would commit never passes a record of that
  assignment whose job has not finished - a late finish from an earlier assignment of the
  same partition does not count (its ticket is a forgotten object).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiokafka import TopicPartition
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from consumers.offsets import OffsetTracker, PartitionOffsets

PARTITIONS = [TopicPartition("traces", 0), TopicPartition("traces", 1)]


@dataclass(eq=False)
class Job:
    """One delivery of one record, started under the assignment that fetched it."""

    tp: TopicPartition
    offset: int
    ticket: PartitionOffsets
    assignment: int


@dataclass
class Partition:
    committed: int = 0  # on the broker
    position: int | None = None  # the next offset to fetch; None while not assigned to us
    assignment: int = 0  # which assignment of this partition is current
    fetched_upto: int = 0  # one past the highest offset ever fetched
    finished_once: set[int] = field(default_factory=set)  # offsets some delivery finished


class OffsetTrackerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tracker = OffsetTracker()
        self.partitions = {tp: Partition() for tp in PARTITIONS}
        self.jobs: list[Job] = []  # in flight, any assignment
        self.commit_in_flight: dict[TopicPartition, int] | None = None

    # --- the broker's side ---------------------------------------------------------------------

    @rule(tp=st.sampled_from(PARTITIONS))
    def assign(self, tp: TopicPartition) -> None:
        p = self.partitions[tp]
        if p.position is None:
            p.assignment += 1
            p.position = p.committed  # the consumer resumes at the committed offset

    @rule(tp=st.sampled_from(PARTITIONS), commit_succeeds=st.booleans())
    def revoke(self, tp: TopicPartition, commit_succeeds: bool) -> None:
        p = self.partitions[tp]
        if p.position is None:
            return
        if commit_succeeds:  # CommitOnRevoke: commit what is finished on it, then forget it
            moves = {t: o for t, o in self.tracker.to_commit().items() if t == tp}
            self._broker_commits(moves)
            self.tracker.committed(moves)
        self.tracker.forget({tp})
        p.position = None  # its jobs in flight go on, holding a ticket of a forgotten object

    # --- the loop's side -----------------------------------------------------------------------

    @rule(tp=st.sampled_from(PARTITIONS), count=st.integers(min_value=1, max_value=4))
    def fetch(self, tp: TopicPartition, count: int) -> None:
        p = self.partitions[tp]
        if p.position is None:
            return
        for _ in range(count):
            offset = p.position
            self.jobs.append(Job(tp, offset, self.tracker.started(tp, offset), p.assignment))
            p.position += 1
            p.fetched_upto = max(p.fetched_upto, p.position)

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        job = self.jobs.pop(data.draw(st.integers(min_value=0, max_value=len(self.jobs) - 1)))
        job.ticket.finished(job.offset)
        self.partitions[job.tp].finished_once.add(job.offset)

    @precondition(lambda self: self.commit_in_flight is None)
    @rule()
    def commit_sent(self) -> None:
        self.commit_in_flight = self.tracker.to_commit()

    @precondition(lambda self: self.commit_in_flight is not None)
    @rule()
    def commit_acknowledged(self) -> None:
        assert self.commit_in_flight is not None
        moves, self.commit_in_flight = self.commit_in_flight, None
        self._broker_commits(moves)
        self.tracker.committed(moves)

    def _broker_commits(self, moves: dict[TopicPartition, int]) -> None:
        for tp, offset in moves.items():
            self.partitions[tp].committed = offset

    # --- invariants ----------------------------------------------------------------------------

    @invariant()
    def committed_offset_never_passes_an_unfinished_record(self) -> None:
        for tp, p in self.partitions.items():
            unfinished = [o for o in range(p.fetched_upto) if o not in p.finished_once]
            assert p.committed <= min(unfinished, default=p.fetched_upto), (
                f"{tp}: committed {p.committed} passes unfinished record {min(unfinished)}")

    @invariant()
    def within_an_assignment_only_its_own_finishes_count(self) -> None:
        for tp, p in self.partitions.items():
            if p.position is None:
                continue
            mine = [j.offset for j in self.jobs if j.tp == tp and j.assignment == p.assignment]
            committable = self.tracker.committable(tp)
            if committable is not None and mine:
                assert committable <= min(mine), (
                    f"{tp}: would commit {committable} past {min(mine)}, in flight in this assignment")

    @invariant()
    def in_flight_counts_the_current_assignments_jobs(self) -> None:
        current = sum(1 for j in self.jobs if self.partitions[j.tp].position is not None
                      and j.assignment == self.partitions[j.tp].assignment)
        assert self.tracker.in_flight() == current


OffsetTrackerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestOffsetTracker = OffsetTrackerMachine.TestCase

