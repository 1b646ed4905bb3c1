"""The OTLP assembly buffer on the real Redis: a trace is due once its root arrived and it went
quiet, or at max wait (partial); claims are exclusive under a lease that a dead worker's expiry
hands on; redelivered spans change nothing; late spans are counted, not buffered; the per-trace
and total bounds hold; projects never share a trace."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from adapters.stores.otlp_buffer import OtlpBuffer
from scoring.otlp.mapping import BufferedSpan, assemble
from scoring.subjects import Span

pytestmark = pytest.mark.integration

QUIET_S, MAX_WAIT_S = 0.3, 1.2


def span(trace: str, span_id: str, parent: str | None = None, project: str = "p-1", text: str = "x") -> BufferedSpan:
    return BufferedSpan(trace_id=trace, project_id=project, service="svc",
                        span=Span(span_id=span_id, parent_span_id=parent, output=text,
                                  start_time=datetime(2026, 12, 2, 13, 0, int(span_id[-1]) % 60, tzinfo=UTC)))


def buffer(redis: Redis, unique: str, **over: float) -> OtlpBuffer:
    return OtlpBuffer(redis, **{"quiet_s": QUIET_S, "max_wait_s": MAX_WAIT_S, "lease_s": 0.6,
                                "prefix": f"test-otlp-{unique}", **over})  # type: ignore[arg-type]


async def claim_after(b: OtlpBuffer, seconds: float) -> list:
    await asyncio.sleep(seconds)
    return await b.claim_due()


async def test_a_trace_is_due_once_its_root_arrived_and_it_went_quiet(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique)
    added = await b.add([span("t1", "c1", "r1"), span("t1", "r1")])
    assert (added.added, added.late, added.full) == (2, 0, False)
    assert await b.claim_due() == [], "not quiet yet"
    (due,) = await claim_after(b, QUIET_S + 0.2)
    assert due.member == "p-1/t1" and due.complete and sorted(s.span.span_id for s in due.spans) == ["c1", "r1"]
    assert b.size.traces == 1 and b.size.spans == 2 and b.size.bytes > 0
    assert await b.claim_due() == [], "claimed: no second worker gets it while the lease lives"
    assert await b.finish([due]) == 0
    late = await b.add([span("t1", "c2", "r1")])
    assert (late.added, late.late) == (0, 1), "a span of an emitted trace is counted late, not buffered"
    assert await claim_after(b, QUIET_S + 0.2) == []
    assert (b.size.traces, b.size.spans, b.size.bytes) == (0, 0, 0)


async def test_a_trace_whose_root_never_arrives_is_due_at_max_wait_as_partial(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique)
    await b.add([span("t2", "c1", "r-missing")])
    await asyncio.sleep(QUIET_S + 0.2)
    await b.add([span("t2", "c2", "r-missing")])
    assert await claim_after(b, QUIET_S + 0.2) == [], "quiet is not enough without the root"
    (due,) = await claim_after(b, MAX_WAIT_S)
    assert not due.complete and len(due.spans) == 2
    await b.finish([due])


async def test_redelivered_spans_change_nothing(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique)
    spans = [span("t3", "r1"), span("t3", "c1", "r1")]
    await b.add(spans)
    again = await b.add(spans)
    assert again.added == 0
    (due,) = await claim_after(b, QUIET_S + 0.2)
    assert len(due.spans) == 2 and b.size.spans == 2
    await b.finish([due])


async def test_a_worker_that_dies_mid_emit_hands_the_trace_on_when_its_lease_expires(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique)
    await b.add([span("t4", "r1")])
    (first,) = await claim_after(b, QUIET_S + 0.2)
    assert await b.claim_due() == []
    (again,) = await claim_after(b, 0.8)  # the lease (0.6 s) ran out: the trace is claimable again
    assert again.member == first.member and [s.span for s in again.spans] == [s.span for s in first.spans]
    await b.finish([again])
    assert await b.finish([first]) == 0, "finishing twice is harmless"


async def test_spans_arriving_after_the_claim_are_late(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique)
    await b.add([span("t5", "r1")])
    (due,) = await claim_after(b, QUIET_S + 0.2)
    await b.add([span("t5", "c9", "r1")])
    assert await b.finish([due]) == 1
    assert await claim_after(b, QUIET_S + 0.2) == []
    assert b.size.spans == 0


async def test_per_trace_bounds_drop_spans_and_mark_the_trace_partial(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique, max_spans=2)
    result = await b.add([span("t6", "r1"), span("t6", "c1", "r1"), span("t6", "c2", "r1")])
    assert (result.added, result.dropped) == (2, 1)
    (due,) = await claim_after(b, QUIET_S + 0.2)
    assert due.dropped == 1 and len(due.spans) == 2
    assert assemble(due.spans, partial=not due.complete, assembly="quiet", dropped_spans=due.dropped).metadata["partial"]
    await b.finish([due])
    small = buffer(redis, unique + "b", max_trace_bytes=600)
    result = await small.add([span("t7", "r1", text="a" * 200), span("t7", "c1", "r1", text="b" * 400)])
    assert (result.added, result.dropped) == (1, 1)


async def test_the_total_bound_refuses_new_spans_until_traces_leave(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique, max_total_bytes=16)  # one byte per shard: any trace fills its shard
    spans = [span(f"t8-{i}", "r1") for i in range(40)]
    await b.add(spans)
    refused = await b.add([span(f"t9-{i}", "r1") for i in range(40)])
    assert refused.full
    due = await claim_after(b, QUIET_S + 0.2)
    await b.finish(due)
    assert not (await b.add([span("t10", "r1")])).full


async def test_projects_never_share_a_trace(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique)
    await b.add([span("same", "r1", project="p-a", text="a"), span("same", "r1", project="p-b", text="b")])
    due = await claim_after(b, QUIET_S + 0.2)
    assert sorted((d.member, d.spans[0].span.output) for d in due) == [("p-a/same", "a"), ("p-b/same", "b")]
    await b.finish(due)


async def test_a_project_over_its_share_is_refused_while_others_go_on(redis: Redis, unique: str) -> None:
    b = buffer(redis, unique, max_total_bytes=1 << 20, max_project_bytes=16 * 400)  # 400 bytes a shard: 2 traces
    first = await b.add([span(f"a{i}", "r1", project="p-flood") for i in range(60)])
    assert first.refused, "once a shard holds the project's share, its next traces are refused"
    assert all(m.startswith("p-flood/") for m in first.refused)
    assert first.added + len(first.refused) == 60, "nothing refused is stored; nothing else is lost"
    other = await b.add([span(f"b{i}", "r1", project="p-quiet") for i in range(2)])
    assert (other.added, other.refused) == (2, frozenset()), "another project is not held back"
    due = await claim_after(b, QUIET_S + 0.2)
    await b.finish(due)
    again = await b.add([span(f"c{i}", "r1", project="p-flood") for i in range(3)])
    assert again.refused == frozenset() and again.added == 3, "the share frees up as traces leave"
    await b.finish(await claim_after(b, QUIET_S + 0.2))
