"""An offset commit is bounded: with the broker frozen (SIGSTOP: it holds its connections and
answers nothing, as a broker restarting or a coordinator unknown after one does), a commit fails
within COMMIT_TIMEOUT_S with a retriable error instead of waiting without end - a loop waiting in
a commit neither turned nor stopped (seen: a worker that did not stop on SIGTERM for 80 s). Once
the broker answers again, the next commit commits. A broker of its own: freezing the shared one
would stall every other test."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from consumers import offsets
from consumers.offsets import Committer, CommitTimedOut
from devtools.services import LocalKafka

pytestmark = [pytest.mark.integration, pytest.mark.alone]


@pytest.fixture(scope="module")
def broker() -> Iterator[LocalKafka]:
    kafka = LocalKafka().start()
    try:
        yield kafka
    finally:
        kafka.stop()


async def test_a_commit_to_a_broker_that_answers_nothing_fails_in_time_and_the_next_one_commits(
        broker: LocalKafka, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offsets, "COMMIT_TIMEOUT_S", 2.0)
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    await producer.send_and_wait("frozen", b"one")
    await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="commit-bound",
                                enable_auto_commit=False, auto_offset_reset="earliest")
    tp = TopicPartition("frozen", 0)
    consumer.assign([tp])
    await consumer.start()
    committer = Committer(consumer, interval_s=1.0)
    try:
        record = await consumer.getone()
        committer.tracker.started(tp, record.offset).finished(record.offset)
        assert broker.proc is not None
        os.kill(broker.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(CommitTimedOut) as failed:
                await committer.commit()
            assert time.monotonic() - started < 2.0 + 3.0, "bounded by COMMIT_TIMEOUT_S, not the coordinator"
            assert failed.value.retriable, "a loop rides it out as any failed commit"
        finally:
            os.kill(broker.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 60
        while True:  # the broker answers again: a later commit commits
            try:
                assert await committer.commit() == {tp: record.offset + 1}
                break
            except CommitTimedOut:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.5)
        assert (await consumer.committed(tp)) == record.offset + 1
    finally:
        await consumer.stop()
