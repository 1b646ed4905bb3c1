"""The outage guard: waits out "unreachable for now", never retries anything else, gives up past
its tolerance, and says what it waits for while it does."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, UnknownTopicOrPartitionError
from redis.exceptions import ClusterDownError, MasterDownError, ResponseError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from adapters.stores.client import PoolBusy
from consumers.outage import OutageGuard, OutageTooLong, not_the_subjects_fault, outage_of


def test_what_counts_as_an_outage() -> None:
    assert outage_of(RedisConnectionError("down")) == "redis"
    assert outage_of(KafkaConnectionError()) == "kafka"
    assert outage_of(KafkaTimeoutError()) == "kafka"
    assert outage_of(UnknownTopicOrPartitionError()) == "kafka"  # retriable per aiokafka
    assert outage_of(ResponseError("WRONGTYPE")) is None  # a bug or bad data, not an outage
    assert outage_of(ValueError("x")) is None


def test_one_rule_says_which_failures_are_the_infrastructures_not_the_subjects() -> None:
    # A loop stops (and is redelivered) for these; it never dead-letters a trace for them.
    assert not_the_subjects_fault(OutageTooLong("redis away for 121s"))
    assert not_the_subjects_fault(ResponseError("OOM command not allowed"))  # Redis answered: still not the trace
    assert not_the_subjects_fault(KafkaConnectionError())
    assert not_the_subjects_fault(ConnectionResetError())  # a socket under either client
    # What a tenant's trace can break: its own problem, dead-lettered with the reason.
    assert not not_the_subjects_fault(ValueError("a field no member can read"))
    assert not not_the_subjects_fault(RecursionError())


async def test_an_outage_is_waited_out_and_reported_meanwhile() -> None:
    changes: list[tuple[str, bool]] = []

    class Changes:
        def outage(self, dependency: str, unreachable: bool) -> None:
            changes.append((dependency, unreachable))

    guard = OutageGuard(tolerance_s=30, events=Changes())
    failures = 3
    seen_reason: list[str | None] = []

    async def step() -> str:
        nonlocal failures
        seen_reason.append(guard.reason)
        if failures:
            failures -= 1
            raise RedisConnectionError("Connection refused")
        return "done"

    assert await guard.call(step) == "done"
    assert seen_reason[0] is None and all(r and r.startswith("redis unreachable") for r in seen_reason[1:])
    assert guard.reason is None
    assert changes == [("redis", True), ("redis", False)]


async def test_the_pool_full_is_waited_out_and_never_reported_as_an_outage() -> None:
    changes: list[tuple[str, bool]] = []

    class Changes:
        def outage(self, dependency: str, unreachable: bool) -> None:
            changes.append((dependency, unreachable))

    guard = OutageGuard(tolerance_s=30, events=Changes())
    busy = 2
    reasons: list[str | None] = []

    async def step() -> str:
        nonlocal busy
        reasons.append(guard.reason)
        if busy:
            busy -= 1
            raise PoolBusy("every one of the 8 Redis connections stayed in use")
        return "done"

    assert outage_of(PoolBusy("full")) is None
    assert await guard.call(step) == "done"
    assert reasons == [None, None, None] and changes == [], "back-pressure: no outage reported, /readyz stays ready"
    assert not_the_subjects_fault(PoolBusy("full")), "a trace is never blamed for the pool"


async def test_the_pool_full_past_the_tolerance_is_given_up() -> None:
    guard = OutageGuard(tolerance_s=0.2)

    async def step() -> None:
        raise PoolBusy("full")

    with pytest.raises(OutageTooLong, match="redis pool"):
        await guard.call(step)


async def test_other_errors_are_raised_at_once() -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        raise ResponseError("NOSCRIPT")

    with pytest.raises(ResponseError):
        await OutageGuard(tolerance_s=30).call(step)
    assert calls == 1


async def test_an_outage_past_the_tolerance_is_given_up() -> None:
    guard = OutageGuard(tolerance_s=0.3)

    async def step() -> None:
        raise KafkaConnectionError()

    with pytest.raises(OutageTooLong) as caught:
        await asyncio.wait_for(guard.call(step), 10)
    assert "kafka unreachable" in str(caught.value) and guard.reason is None


async def test_redis_pys_transport_race_on_a_closed_connection_is_a_redis_outage() -> None:
    # The connection's writer torn down under a write (a Cluster primary failing over): redis-py
    # raises AttributeError from its own code (redis/redis-py#4287) - a broken connection, not a bug of ours.
    import redis.asyncio.connection

    connection = redis.asyncio.connection.Connection()
    connection._writer = None
    try:
        await connection._send_packed_command([b"PING\r\n"])
    except AttributeError as exc:
        raced = exc
    assert outage_of(raced) == "redis"

    def ours() -> None:
        None.writelines  # type: ignore[attr-defined]  # noqa: B018

    try:
        ours()
    except AttributeError as exc:
        assert outage_of(exc) is None, "the same error raised by our own code is a bug, not an outage"


def test_a_write_to_a_connection_uvloop_closed_is_a_redis_outage() -> None:
    # A Cluster primary killed under a pipeline: uvloop's transport is closed when redis-py writes,
    # and uvloop raises RuntimeError ("the handler is closed") - it stopped a worker in a chaos run.
    import redis.asyncio.connection
    import uvloop

    async def write_after_close() -> BaseException | None:
        server = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
            connection = redis.asyncio.connection.Connection()
            connection._reader, connection._writer = reader, writer
            writer.transport.abort()
            await asyncio.sleep(0.01)
            try:
                await connection._send_packed_command([b"PING\r\n"])
            except RuntimeError as exc:
                return exc
            return None
        finally:
            server.close()

    raised = uvloop.run(write_after_close())
    assert isinstance(raised, RuntimeError) and outage_of(raised) == "redis"
    try:
        raise RuntimeError("the handler is closed")  # the same words from our own code: a bug
    except RuntimeError as exc:
        assert outage_of(exc) is None


@pytest.mark.parametrize("answer", [ClusterDownError("The cluster is down"), MasterDownError("link with master is down"),
                                    TryAgainError("Multiple keys request during rehashing of slot"),
                                    SlotNotCoveredError("slot 42 is not covered")])
def test_a_redis_cluster_failing_over_is_a_redis_outage(answer: Exception) -> None:
    assert outage_of(answer) == "redis"


async def test_one_loops_long_wait_does_not_end_another_loops_first_retries() -> None:
    # The worker's loops share one guard. The tolerance counts from each step's own first failure:
    # a step that starts failing late in another's long outage gets its whole tolerance too.
    guard = OutageGuard(tolerance_s=1.0)

    async def down() -> str:
        raise RedisConnectionError("Connection refused")

    failures = 3

    async def back_soon() -> str:
        nonlocal failures
        if failures:
            failures -= 1
            raise RedisConnectionError("Connection refused")
        return "done"

    async def late() -> str:
        await asyncio.sleep(0.95)  # the first step has been failing for 0.95 s; this one's 3 failures end past 1 s
        return await guard.call(back_soon)

    first, second = await asyncio.gather(guard.call(down), late(), return_exceptions=True)
    assert isinstance(first, OutageTooLong), first
    assert second == "done", repr(second)
