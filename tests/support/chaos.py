"""What the chaos tests share (tests/reliability/test_chaos*.py): a tail of the ratings topic
that paces the faults, reading a topic whole, the consumer group's commit lag, and the worker
processes with the faults that hit workers (a kill, a join)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from tests.support.harness import WorkerProcess


def trace_pair(rating: dict[str, Any]) -> tuple[str, ...]:
    return rating["traceId"], rating["groupId"]



@dataclass
class RatingsTail:
    """Reads the ratings topic as it grows (to pace the faults); survives the broker's restart."""

    bootstrap: str
    topic: str
    pair_of: Callable[[dict[str, Any]], tuple[Any, ...]] = trace_pair
    pairs: set[tuple[Any, ...]] = field(default_factory=set)
    task: asyncio.Task[None] | None = None

    def start(self) -> RatingsTail:
        self.task = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        consumer = AIOKafkaConsumer(self.topic, bootstrap_servers=self.bootstrap, group_id=None,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            while True:
                try:
                    batches = await consumer.getmany(timeout_ms=200)
                except KafkaError:  # the broker is down: the client reconnects by itself
                    await asyncio.sleep(0.5)
                    continue
                for records in batches.values():
                    for r in records:
                        self.pairs.add(self.pair_of(orjson.loads(r.value)))
        finally:
            await consumer.stop()

    async def wait_for(self, pairs: int, timeout_s: float, check: Callable[[], None]) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.pairs) < pairs:
            check()
            assert time.monotonic() < deadline, f"only {len(self.pairs)} of {pairs} pairs rated in {timeout_s:g}s"
            await asyncio.sleep(0.2)

    async def wait_for_all(self, wanted: set[tuple[Any, ...]], timeout_s: float, check: Callable[[], None]) -> None:
        """Until every pair of ``wanted`` is rated. (A count is not enough where subjects can be
        rated more than once on the way: a conversation whose last turn came late is judged at
        fewer turns first.)"""
        deadline = time.monotonic() + timeout_s
        while not wanted <= self.pairs:
            check()
            assert time.monotonic() < deadline, f"{len(wanted - self.pairs)} of {len(wanted)} pairs not rated " \
                                                f"in {timeout_s:g}s, e.g. {sorted(wanted - self.pairs)[:3]}"
            await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


async def read_everything(bootstrap: str, topic: str, partitions: int) -> list[dict[str, Any]]:
    """Every record of ``topic`` up to its current end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    await consumer.start()
    values: list[dict[str, Any]] = []
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        await consumer.seek_to_beginning(*assigned)
        ends = await consumer.end_offsets(assigned)
        async with asyncio.timeout(60):
            while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    values.extend(orjson.loads(r.value) for r in records)
    finally:
        await consumer.stop()
    return values


async def commit_lag(bootstrap: str, topic: str, group: str, partitions: int) -> int:
    """Records of ``topic`` past the group's committed offsets (0: committed to the end)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group)
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return sum(end - (committed[tp].offset if tp in committed else 0) for tp, end in ends.items())
    finally:
        await consumer.stop()
        await admin.close()


async def wait_committed(bootstrap: str, env: dict[str, str], partitions: int, check: Callable[[], None],
                         timeout_s: float = 30) -> None:
    """Until the workers' group has committed to the end of the traces topic, ``check``ing the
    workers meanwhile."""
    deadline = time.monotonic() + timeout_s
    while (lag := await commit_lag(bootstrap, env["SGW_TRACES_TOPIC"], env["SGW_CONSUMER_GROUP"], partitions)) > 0:
        check()
        assert time.monotonic() < deadline, f"{lag} records past the committed offsets after {timeout_s:g}s"
        await asyncio.sleep(0.5)


def readiness(worker: WorkerProcess) -> str:
    try:
        response = httpx.get(worker.url + "/readyz", timeout=2)
        return f"{response.status_code} {response.text.strip()}"
    except httpx.HTTPError as exc:
        return f"unreachable {exc!r}"


@dataclass(kw_only=True)
class Workers:
    """The worker processes of a chaos run; ``killed`` are those the test killed."""

    env: dict[str, str]
    log_dir: Path
    running: list[WorkerProcess] = field(default_factory=list)
    killed: list[WorkerProcess] = field(default_factory=list)
    started: int = 0
    not_ready_seen: set[str] = field(default_factory=set)
    rescored: float = 0  # pairs the stopped workers scored again after a pause (their metric)

    async def start_worker(self) -> WorkerProcess:
        self.started += 1
        worker = WorkerProcess(self.env, name=f"worker-{self.started}").start(self.log_dir)
        self.running.append(worker)
        await asyncio.to_thread(worker.wait_ready)
        return worker

    def check_running(self) -> None:
        """No worker the test did not kill has exited."""
        for worker in self.running:
            assert worker.proc is not None
            if worker.proc.poll() is not None:
                # Why it stopped is near its start ("stopping: the ... failed"); the tail is its way out.
                errors = [line for line in worker.logs(whole=True).splitlines() if '"level": "error"' in line]
                raise AssertionError(f"{worker.name} exited with {worker.proc.returncode}:\n"
                                     + "\n".join(errors[:5])[:6000] + f"\n...\n{worker.logs()}")

    async def watch(self, seconds: float) -> None:
        """Wait ``seconds``, checking that every worker runs and noting why they are not ready."""
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            self.check_running()
            for worker in self.running:
                said = await asyncio.to_thread(readiness, worker)
                if not said.startswith("200"):
                    self.not_ready_seen.add(re.sub(r"\d+s\b", "Ns", said.split(" (", 1)[0])[:80])
            await asyncio.sleep(0.5)

    # 1. A worker dies without a word: no drain, no commit, no released leases.
    async def kill_a_worker(self) -> None:
        victim = self.running.pop(0)
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        self.killed.append(victim)

    # 2. A new worker joins: the group rebalances while the others have work in flight.
    async def a_worker_joins(self) -> None:
        await self.start_worker()

    def stop(self, worker: WorkerProcess) -> int | str:
        """SIGTERM: the exit code, or why there is none."""
        with contextlib.suppress(Exception):  # read while it still serves its metrics
            self.rescored += worker.metric("sgw_pairs_rescored_after_pause_total")
        try:
            return worker.stop()
        except AssertionError as exc:
            return f"did not stop on SIGTERM: {str(exc)[:200]}"
