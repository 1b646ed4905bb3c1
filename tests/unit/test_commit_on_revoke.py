"""The rebalance listener: before partitions move, commit what is finished on exactly those
partitions, then forget them; a failed commit is logged and never stops the handover."""

from __future__ import annotations

from aiokafka import TopicPartition
from structlog.testing import capture_logs

from consumers.offsets import CommitOnRevoke, OffsetTracker

A, B = TopicPartition("traces", 0), TopicPartition("traces", 1)


async def test_revocation_commits_the_revoked_partitions_then_forgets_them() -> None:
    tracker = OffsetTracker()
    tracker.started(A, 4).finished(4)
    tracker.started(B, 9)
    seen: list[object] = []

    async def commit(partitions: set[TopicPartition]) -> None:
        seen.append((partitions, tracker.committable(A)))  # still tracked while committing

    with capture_logs() as logs:
        await CommitOnRevoke(commit, tracker=tracker).on_partitions_revoked({A})
    assert seen == [({A}, 5)]
    assert tracker.committable(A) is None and tracker.committable(B) == 9, "only the revoked one is forgotten"
    assert logs == [{"event": "partitions revoked", "partitions": ["traces:0"], "log_level": "info"}]


async def test_a_failed_commit_is_logged_and_the_partitions_still_forgotten() -> None:
    tracker = OffsetTracker()
    tracker.started(A, 1)

    async def commit(partitions: set[TopicPartition]) -> None:
        raise RuntimeError("rebalance in progress")

    with capture_logs() as logs:
        await CommitOnRevoke(commit, tracker=tracker).on_partitions_revoked({A, B})
    assert tracker.committable(A) is None
    assert logs[0]["event"] == "commit on revocation failed; the new owner may redeliver"
    assert logs[0]["log_level"] == "warning" and logs[0]["exc_info"] is True
    assert logs[1] == {"event": "partitions revoked", "partitions": ["traces:0", "traces:1"], "log_level": "info"}


async def test_assignment_is_reported_to_the_callback_and_logged() -> None:
    assigned: list[set[TopicPartition]] = []

    async def commit(partitions: set[TopicPartition]) -> None:
        pass

    with capture_logs() as logs:
        await CommitOnRevoke(commit, assigned.append).on_partitions_assigned({B, A})
        await CommitOnRevoke(commit).on_partitions_assigned({A})  # no callback: nothing to call
        await CommitOnRevoke(commit).on_partitions_revoked({A})  # no tracker: nothing to forget
    assert assigned == [{A, B}]
    assert logs[0] == {"event": "partitions assigned", "partitions": ["traces:0", "traces:1"], "log_level": "info"}
    assert [entry["event"] for entry in logs] == ["partitions assigned", "partitions assigned", "partitions revoked"]
