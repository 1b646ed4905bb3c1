"""The one double of the live loop that the loop's tests share: a ``TraceConsumer`` running in the
test's own process on the real broker and Redis, with what a test needs to drive it (send
traces, start, halt) and to look at it (claims as stored, commits, what was published).

What a test controls - a panel that blocks, claims that hold, a producer that holds sends, a
gated external scorer - is passed in as ``controls``: each test file builds its own.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord
from redis.asyncio import Redis

from adapters.stores.claims import Claims
from consumers.outputs import TopicNames
from consumers.traces import TraceConsumer
from scoring.claim_request import ClaimRequest, day_of

# Every wait below ends by this deadline; none is a sleep a result depends on. Mutation runs may
# set it lower, so that a mutant which stalls the loop fails in seconds.
WAIT_S = float(os.environ.get("SGW_TEST_WAIT_S", "15"))
TIMESTAMP = "2026-12-02T13:00:00Z"
DAY = day_of(datetime(2026, 12, 2, 13, tzinfo=UTC).timestamp())  # the traces' own day: their claims' hash


async def until(check: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> None:
    """Wait for ``check()`` (a value or an awaitable) to be truthy; fail saying ``what`` if it is not."""
    deadline = time.monotonic() + timeout_s
    while True:
        ok = check()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def trace(project: str, trace_id: str, output: str, session: str | None = None, expected: str | None = None) -> bytes:
    """A trace record's value: one span answering ``output``, at TIMESTAMP."""
    doc: dict[str, Any] = {"traceId": trace_id, "projectId": project, "agentId": "a", "timestamp": TIMESTAMP,
                           "spans": [{"spanId": "r", "input": "q", "output": output}]}
    if session is not None:
        doc["sessionId"] = session
    if expected is not None:
        doc["expected"] = expected
    return orjson.dumps(doc)


@dataclass
class Loop:
    traces: TraceConsumer
    consumer: AIOKafkaConsumer
    producer: AIOKafkaProducer
    redis: Redis
    project: str
    topics: TopicNames
    tp: TopicPartition
    bootstrap: str
    controls: Any = None  # what the test file controls the loop with
    group_id: str = ""
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event | None = None
    _consumer_started: bool = field(default=False, repr=False)

    # --- driving it -----------------------------------------------------------------------------

    async def send(self, trace_id: str, output: str = "fine", *, session: str | None = None,
                   project: str | None = None, partition: int = 0, expected: str | None = None) -> None:
        await self.producer.send_and_wait(self.topics.traces, key=trace_id.encode(),
                                          value=trace(project or self.project, trace_id, output, session, expected),
                                          partition=partition)

    async def send_raw(self, value: bytes | None, key: bytes | None) -> None:
        await self.producer.send_and_wait(self.topics.traces, key=key, value=value, partition=0)

    async def start(self) -> None:
        """Join the group (records sent before are in its first fetch) and run the loop."""
        if not self._consumer_started:
            await self.consumer.start()
            self._consumer_started = True
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.traces.run(self.stop))
        await until(self._assigned, "the partition assignment")

    def _assigned(self) -> bool:
        if self.task is not None and self.task.done():
            self.task.result()
        return self.traces.assigned_once

    async def halt(self) -> None:
        """Stop the loop (not drained)."""
        assert self.stop is not None and self.task is not None
        self.stop.set()
        await asyncio.wait_for(self.task, WAIT_S)

    async def steps(self, n: int = 2) -> None:
        """Wait until the loop has gone through ``n`` more turns."""
        for _ in range(n):
            before = self.traces.last_progress
            await until(lambda b=before: self.traces.last_progress > b, "a turn of the loop")  # type: ignore[misc]

    async def close(self, drain_s: float) -> None:
        """Stop what runs (drained within ``drain_s``) and the clients."""
        if self.stop is not None and self.task is not None:
            self.stop.set()
            await asyncio.gather(self.task, return_exceptions=True)
            await self.traces.drain(drain_s)
        await self.consumer.stop()
        await self.producer.stop()

    # --- looking at it --------------------------------------------------------------------------

    def request(self, group_id: str, trace_id: str, judge_calls: int = 0,
                calls_cap: int | None = None) -> ClaimRequest:
        return ClaimRequest(self.project, group_id, f"trace:{trace_id}", judge_calls, calls_cap, day=DAY)

    async def state(self, group_id: str, trace_id: str) -> str:
        """The pair's claim as stored (read without claiming): lease:..., done:..., skipped:... or ''."""
        return await Claims(self.redis).stored(self.request(group_id, trace_id))

    async def done(self, *trace_ids: str, group_id: str = "g") -> None:
        async def all_done() -> bool:
            states = [await self.state(group_id, t) for t in trace_ids]
            return all(s.startswith("done:") for s in states)
        await until(all_done, f"{trace_ids} marked done")

    async def committed(self, tp: TopicPartition | None = None) -> int | None:
        return await self.consumer.committed(tp or self.tp)  # type: ignore[no-any-return]

    async def committed_to(self, offset: int) -> None:
        async def there() -> bool:
            return await self.committed() == offset
        await until(there, f"the commit to reach {offset}")

    async def read(self, topic: str) -> list[ConsumerRecord]:
        """Every record on partition 0 of ``topic``, read to its end."""
        reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False, group_id=None)
        await reader.start()
        try:
            tp = TopicPartition(topic, 0)
            reader.assign([tp])
            await reader.seek_to_beginning(tp)
            end = (await reader.end_offsets([tp]))[tp]
            records: list[ConsumerRecord] = []
            deadline = time.monotonic() + WAIT_S
            while await reader.position(tp) < end and time.monotonic() < deadline:
                for batch in (await reader.getmany(tp, timeout_ms=200)).values():
                    records.extend(batch)
            return records
        finally:
            await reader.stop()

    async def rating_documents(self) -> list[dict[str, Any]]:
        """Every rating published, as its JSON."""
        return [orjson.loads(r.value) for r in await self.read(self.topics.ratings)]

    async def ratings(self) -> list[tuple[str, str]]:
        """(group, trace) of every rating published, sorted."""
        return sorted((v["groupId"], v["traceId"]) for v in await self.rating_documents())

    async def dead(self) -> list[tuple[bytes | None, dict[str, Any]]]:
        return [(r.key, orjson.loads(r.value)) for r in await self.read(self.topics.dlq)]
