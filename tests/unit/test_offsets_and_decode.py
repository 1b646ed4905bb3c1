"""Ordered commits and record decoding: the pieces the live loop's guarantees rest on."""

from __future__ import annotations

import orjson
from aiokafka import TopicPartition

from consumers.decode import DeadLetter, decode_trace
from consumers.offsets import OffsetTracker
from scoring.subjects import Trace

TP = TopicPartition("traces", 0)
OTHER = TopicPartition("traces", 1)


def test_commit_stops_below_the_oldest_unfinished_offset() -> None:
    t = OffsetTracker()
    tickets = {offset: t.started(TP, offset) for offset in range(10, 15)}
    for offset in (11, 13, 14):  # finished out of order
        tickets[offset].finished(offset)
    assert t.committable(TP) == 10, "10 is still in flight: nothing past it may be committed"
    tickets[10].finished(10)
    assert t.committable(TP) == 12
    tickets[12].finished(12)
    assert t.committable(TP) == 15, "all done: commit one past the last"


def test_to_commit_reports_only_moves() -> None:
    t = OffsetTracker()
    t.started(TP, 0).finished(0)
    t.started(OTHER, 7)
    assert t.to_commit() == {TP: 1, OTHER: 7}
    t.committed({TP: 1, OTHER: 7})
    assert t.to_commit() == {}
    assert t.in_flight() == 1


def test_a_revoked_partition_is_forgotten_and_late_finishes_ignored() -> None:
    t = OffsetTracker()
    old_ticket = t.started(TP, 5)
    t.forget([TP])
    assert t.committable(TP) is None and t.to_commit() == {}
    # The partition comes back and offset 5 is redelivered; the old job finishing must not
    # mark the new owner's work done.
    t.started(TP, 5)
    old_ticket.finished(5)
    assert t.committable(TP) == 5


def _valid() -> dict:
    return {"traceId": "t-1", "projectId": "p", "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
            "spans": [{"spanId": "r", "input": "q", "output": "a"}]}


def decode(value: bytes | None, max_bytes: int = 10_000) -> Trace | DeadLetter:
    return decode_trace("traces", 3, 42, b"k", value, max_bytes)


def test_a_valid_trace_decodes() -> None:
    result = decode(orjson.dumps({**_valid(), "unknownField": 1}))
    assert isinstance(result, Trace) and result.trace_id == "t-1"


def test_each_kind_of_bad_record_gets_its_reason_and_position() -> None:
    cases = {
        "too_large": decode(orjson.dumps(_valid()), max_bytes=10),
        "not_utf8": decode(b"\xff\xfe{}"),
        "not_json": decode(b"{nope"),
        "invalid_trace": decode(orjson.dumps({**_valid(), "spans": []})),
    }
    for reason, result in cases.items():
        assert isinstance(result, DeadLetter), reason
        assert (result.reason, result.topic, result.partition, result.offset, result.key) == (
            reason, "traces", 3, 42, "k")
    assert cases["not_utf8"].value_encoding == "base64"
    assert "spans: List should have at least 1 item" in cases["invalid_trace"].error
    assert orjson.loads(cases["not_json"].to_json())["value"] == "{nope", "kept as received"


def test_a_tombstone_is_dead_lettered() -> None:
    result = decode(None)
    assert isinstance(result, DeadLetter) and "tombstone" in result.error


def test_a_dead_letter_too_large_for_its_topic_keeps_a_prefix_size_and_hash() -> None:
    import hashlib

    raw = b"\xff" + b"x" * 5000
    result = decode_trace("traces", 0, 1, None, raw, max_bytes=100_000, max_dead_letter_bytes=1000)
    assert isinstance(result, DeadLetter) and result.reason == "not_utf8"
    assert result.value_truncated and result.value_bytes == 5001
    assert result.value_sha256 == hashlib.sha256(raw).hexdigest()
    whole = decode_trace("traces", 0, 1, None, b"{broken", max_bytes=100)
    assert isinstance(whole, DeadLetter) and not whole.value_truncated and whole.value == "{broken"


async def test_batcher_stop_finishes_a_flush_under_way() -> None:
    import asyncio

    from consumers.batcher import Batcher

    written: list[int] = []
    flushing = asyncio.Event()

    async def flush(items: list[int]) -> None:
        flushing.set()
        await asyncio.sleep(0.2)  # a slow Redis round trip
        written.extend(items)

    batcher: Batcher[int, None] = Batcher(flush, max_wait_s=0)
    batcher.start()
    submitted = asyncio.create_task(batcher.submit([1, 2]))
    await flushing.wait()
    await batcher.stop()
    await submitted
    assert written == [1, 2], "the flush under way was finished, not cut"


async def test_a_batcher_answers_each_submitter_with_its_own_items_answers() -> None:
    import asyncio

    from consumers.batcher import Batcher

    calls: list[list[int]] = []

    async def double(items: list[int]) -> list[int]:
        calls.append(items)
        return [2 * i for i in items]

    batcher: Batcher[int, int] = Batcher(double, max_wait_s=0.05)
    batcher.start()
    answers = await asyncio.gather(batcher.submit([1, 2]), batcher.submit([3]), batcher.submit([4, 5, 6]))
    await batcher.stop()
    assert answers == [[2, 4], [6], [8, 10, 12]]
    assert calls == [[1, 2, 3, 4, 5, 6]], "one call for all three"


async def test_a_batcher_lingers_for_more_items_until_full_or_hurried() -> None:
    import asyncio
    import time

    from consumers.batcher import Batcher

    calls: list[tuple[list[int], float]] = []
    started = time.monotonic()

    async def write(items: list[int]) -> None:
        calls.append((items, time.monotonic() - started))

    batcher: Batcher[int, None] = Batcher(write, max_items=4, max_wait_s=30.0)
    batcher.start()
    first = asyncio.create_task(batcher.submit([1]))
    await asyncio.sleep(0.1)
    assert calls == [], "one item lingers for company"
    await asyncio.gather(first, batcher.submit([2, 3, 4]))  # max_items reached: written at once
    assert [items for items, _ in calls] == [[1, 2, 3, 4]]
    pending = asyncio.create_task(batcher.submit([5]))
    await asyncio.sleep(0.05)
    batcher.hurry()  # the caller needs it finished now
    await asyncio.wait_for(pending, 5)
    assert [items for items, _ in calls] == [[1, 2, 3, 4], [5]]
    assert calls[-1][1] < 5, "hurried, not lingering out its 30 s"
    await batcher.stop()
