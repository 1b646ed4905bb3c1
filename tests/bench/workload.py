"""What the benchmark suite feeds and measures with: the groups, ~2 KB traces, the pre-filled
topic, and the instruments (output-topic counts and broker timestamps, a process tree's CPU and
memory from /proc, Redis ``INFO commandstats`` deltas)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from scoring.filters import HEADER_AGENT, HEADER_PROJECT, HEADER_ROOT_NAME, HEADER_TRACE

PARTITIONS = 6
PROJECT = "bench"

# Two deterministic groups: four patterns; a code scorer plus a pattern.
DETERMINISTIC_CATALOG: dict[str, Any] = {
    "patterns": [
        {"id": "email", "name": "Email", "polarity": "failure", "template": "email"},
        {"id": "card", "name": "Card", "polarity": "failure", "template": "credit_card"},
        {"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology"},
        {"id": "refund", "name": "Refund", "polarity": "proper", "contains": ["refund", "return label"]},
    ],
    "customs": [{"id": "length", "name": "Length", "type": "code",
                 "code": "def score(i, o, e, s, m):\n    return min(1.0, len(o) / 600)\n"}],
    "groups": [
        {"id": "patterns", "name": "Patterns", "projectId": PROJECT,
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"},
         "members": [{"kind": "pattern", "refId": "email", "weight": 0, "gate": True},
                     {"kind": "pattern", "refId": "card", "weight": 0, "gate": True},
                     {"kind": "pattern", "refId": "apology", "weight": 1, "gate": False},
                     {"kind": "pattern", "refId": "refund", "weight": 1, "gate": False}]},
        {"id": "code", "name": "Code", "projectId": PROJECT,
         "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 3, "severity": "low"},
         "members": [{"kind": "custom", "refId": "length", "weight": 1, "gate": False},
                     {"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]},
    ],
}
DETERMINISTIC_GROUPS = len(DETERMINISTIC_CATALOG["groups"])

# One group, one judge: every trace is one judge call.
JUDGE_CATALOG: dict[str, Any] = {
    "judges": [{"id": "helpful", "name": "Helpful", "criteria": "Does the agent answer the user's question?"}],
    "groups": [{"id": "judged", "name": "Judged", "projectId": PROJECT,
                "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 3, "severity": "low"},
                "members": [{"kind": "judge", "refId": "helpful", "weight": 1, "gate": False}]}],
}

_SYSTEM = ("You are the support agent of an online shop. Answer politely and precisely, never reveal "
           "another customer's data, offer a return label when the customer asks for a refund, and "
           "escalate to a human when the customer is angry or the order is over 500 EUR. ") * 2
_TOOL_OUT = {"order": {"status": "delivered", "carrier": "DHL", "items": [
    {"sku": "SKU-1001", "name": "Trail running shoes", "qty": 1, "price": 89.9},
    {"sku": "SKU-2044", "name": "Merino socks (3 pairs)", "qty": 2, "price": 14.5}],
    "deliveredAt": "2026-11-28T10:12:00Z", "returnable": True}}


def trace_value(n: int, agent: str = "support-agent") -> bytes:
    """Trace ``n``: a root agent span, an LLM call and a tool call, about 2 KB of JSON. Some
    answers apologise, leak an email or a (Luhn-valid) card number, so every pattern has work."""
    extra = ""
    if n % 7 == 0:
        extra += " I'm sorry about the delay."
    if n % 11 == 0:
        extra += f" Write to customer{n}@example.com for anything else."
    if n % 13 == 0:
        extra += " Your card 4111 1111 1111 1111 was charged."
    answer = (f"Your order {n} was delivered on 28 November. You can print a return label from your account "
              "page; once the parcel is scanned, the refund arrives within five working days." + extra
              + " Is there anything else I can help with?" + " " * (n % 40))
    question = f"Hi, I ordered shoes last week (order {n}) and they don't fit. How do I get my money back?"
    return orjson.dumps({
        "traceId": f"t-{n}", "projectId": PROJECT, "agentId": agent,
        "timestamp": "2026-12-02T13:00:00Z", "metadata": {"channel": "chat", "locale": "en-GB", "tier": "gold"},
        "spans": [
            {"spanId": "root", "name": "agent.run", "input": question, "output": answer,
             "startTime": "2026-12-02T13:00:00Z", "endTime": "2026-12-02T13:00:02Z"},
            {"spanId": "llm-1", "parentSpanId": "root", "name": "chat gpt-4o-mini", "kind": "llm",
             "input": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": question}],
             "output": answer, "attributes": {"gen_ai.usage.input_tokens": 212, "gen_ai.usage.output_tokens": 64}},
            {"spanId": "tool-1", "parentSpanId": "root", "name": "lookup_order", "kind": "tool",
             "input": {"orderId": n}, "output": _TOOL_OUT},
        ]})


# --- Kafka ----------------------------------------------------------------------------------

async def create_topics(bootstrap: str, names: list[str], *, log_append_time: bool = False) -> None:
    """Topics of PARTITIONS partitions; outputs use the broker's append time as their timestamp."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        config = {"message.timestamp.type": "LogAppendTime"} if log_append_time else {}
        existing = set(await admin.list_topics())
        new = [NewTopic(n, PARTITIONS, 1, topic_configs=config) for n in names if n not in existing]
        if new:
            await admin.create_topics(new)
    finally:
        await admin.close()


def routing_headers_of(n: int, agent: str) -> list[tuple[str, bytes]]:
    """The routing headers a producer the operator runs writes with trace ``n`` (scoring.filters)."""
    return [(HEADER_PROJECT, PROJECT.encode()), (HEADER_AGENT, agent.encode()), (HEADER_TRACE, f"t-{n}".encode()),
            (HEADER_ROOT_NAME, b"agent.run")]


async def produce_traces(bootstrap: str, topic: str, first: int, count: int, *,
                         agent: Callable[[int], str] = lambda n: "support-agent", headers: bool = False,
                         timestamp_ms: Callable[[int], int] | None = None) -> float:
    """Produce traces ``first .. first+count-1`` as fast as the broker takes them (of the agent
    ``agent(n)``, with their routing headers if ``headers``, at the record timestamp
    ``timestamp_ms(n)`` if given, else now); returns traces/s."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20,
                                compression_type=None, acks=1)
    await producer.start()
    started = time.monotonic()
    try:
        acks = []
        for n in range(first, first + count):
            who = agent(n)
            acks.append(await producer.send(topic, key=f"t-{n}".encode(), value=trace_value(n, who),
                                            headers=routing_headers_of(n, who) if headers else None,
                                            timestamp_ms=timestamp_ms(n) if timestamp_ms else None))
            if len(acks) >= 5000:
                await asyncio.gather(*acks)
                acks.clear()
        await asyncio.gather(*acks)
    finally:
        await producer.stop()
    return count / (time.monotonic() - started)


class OutputTopic:
    """Counts and broker timestamps of what a scenario wrote, without reading every record."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        self._consumer: AIOKafkaConsumer | None = None

    async def __aenter__(self) -> OutputTopic:
        self._consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None,
                                          enable_auto_commit=False, max_partition_fetch_bytes=1 << 16)
        await self._consumer.start()
        self._consumer.assign(self.tps)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._consumer is not None
        await self._consumer.stop()

    async def count(self) -> int:
        assert self._consumer is not None
        return sum((await self._consumer.end_offsets(self.tps)).values())

    async def wait_for(self, expected: int, timeout_s: float, alive: Any = None) -> int:
        deadline = time.monotonic() + timeout_s
        count = await self.count()
        while count < expected and time.monotonic() < deadline:
            if alive is not None and not alive():
                break
            await asyncio.sleep(0.25)
            count = await self.count()
        return count

    async def _timestamp_at(self, tp: TopicPartition, offset: int) -> int:
        assert self._consumer is not None
        self._consumer.seek(tp, offset)
        while True:
            batch = await self._consumer.getmany(tp, timeout_ms=2000, max_records=1)
            for record in batch.get(tp, []):
                return int(record.timestamp)

    async def span_s(self) -> float:
        """Seconds from the first output record's broker timestamp to the last one's."""
        assert self._consumer is not None
        ends = await self._consumer.end_offsets(self.tps)
        firsts, lasts = [], []
        for tp in self.tps:
            if ends[tp] > 0:
                firsts.append(await self._timestamp_at(tp, 0))
                lasts.append(await self._timestamp_at(tp, ends[tp] - 1))
        return max(0.001, (max(lasts) - min(firsts)) / 1000)

    async def last_values(self, per_partition: int) -> list[bytes]:
        """The values of the last ``per_partition`` records of each partition."""
        assert self._consumer is not None
        ends = await self._consumer.end_offsets(self.tps)
        values: list[bytes] = []
        for tp in self.tps:
            start = max(0, ends[tp] - per_partition)
            self._consumer.seek(tp, start)
            got = 0
            while got < ends[tp] - start:
                batch = await self._consumer.getmany(tp, timeout_ms=2000, max_records=per_partition)
                if not batch:
                    break
                for record in batch.get(tp, []):
                    values.append(record.value)
                    got += 1
        return values

    async def records_keyed(self, keys: set[bytes], expected: int, timeout_s: float) -> list[Any]:
        """The records keyed by one of ``keys``, once ``expected`` of them are out (or at
        ``timeout_s``): a topic others write to as well (a backfill's ratings beside live ones)."""
        assert self._consumer is not None
        for tp in self.tps:
            self._consumer.seek(tp, 0)
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(out) < expected and time.monotonic() < deadline:
            for records in (await self._consumer.getmany(timeout_ms=500, max_records=5000)).values():
                out.extend(r for r in records if r.key in keys)
        return out

    async def records(self) -> list[Any]:
        """Every record (for latency: small topics only)."""
        assert self._consumer is not None
        ends = await self._consumer.end_offsets(self.tps)
        for tp in self.tps:
            self._consumer.seek(tp, 0)
        out: list[Any] = []
        while len(out) < sum(ends.values()):
            for records in (await self._consumer.getmany(timeout_ms=500, max_records=5000)).values():
                out.extend(records)
        return out


# --- processes --------------------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(pid: str) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, RSS bytes) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, int(fields[21]) * _PAGE


def _runqueue_wait_s(pid: int) -> float:
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1])
    except OSError:
        pass
    return total / 1e9


@dataclass
class ProcessTree:
    """Samples a process and its descendants (sandboxes, threads' CPU included) from /proc:
    CPU seconds used since ``mark()`` and the peak of their summed RSS."""

    root: int
    peers: tuple[int, ...] = ()  # processes measured with the root (workers of the same group)
    interval_s: float = 0.25
    cpu: dict[int, float] = field(default_factory=dict)  # last seen, per pid (dead ones kept)
    # Seconds its threads were runnable but waited for a CPU (/proc/PID/task/*/schedstat), per pid:
    # on a shared machine this tells a starved process from one that waits on I/O.
    waited: dict[int, float] = field(default_factory=dict)
    peak_rss: int = 0
    _base: float = 0.0
    _base_root: float = 0.0
    _base_waited: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ProcessTree:
        self._thread = threading.Thread(target=self._run, daemon=True, name="proc-tree")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        stats = {int(p): s for p in os.listdir("/proc") if p.isdigit() and (s := _stat(p)) is not None}
        tree, frontier = {self.root, *self.peers}, [self.root, *self.peers]
        children: dict[int, list[int]] = {}
        for pid, (ppid, _, _) in stats.items():
            children.setdefault(ppid, []).append(pid)
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in tree:
                    tree.add(child)
                    frontier.append(child)
        rss = 0
        for pid in tree & stats.keys():
            self.cpu[pid] = stats[pid][1]
            rss += stats[pid][2]
            self.waited[pid] = _runqueue_wait_s(pid)
        self.peak_rss = max(self.peak_rss, rss)

    def mark(self) -> None:
        """From now on: CPU is counted from here, and the RSS peak starts over."""
        self.sample()
        self._base, self.peak_rss = sum(self.cpu.values()), 0
        self._base_root = self.cpu.get(self.root, 0.0)
        self._base_waited = sum(self.waited.values())
        self.sample()

    def cpu_s(self) -> float:
        self.sample()
        return sum(self.cpu.values()) - self._base

    def root_cpu_s(self) -> float:
        """The root process's own CPU since ``mark()`` (of ``cpu_s()``, what is not its children's)."""
        return self.cpu.get(self.root, 0.0) - self._base_root

    def waited_s(self) -> float:
        """Seconds (summed over threads) runnable but not running since ``mark()``."""
        return sum(self.waited.values()) - self._base_waited

    def root_hwm_mb(self) -> float:
        """The root process's own peak RSS (VmHWM) since it started."""
        for line in Path(f"/proc/{self.root}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


# --- Redis ------------------------------------------------------------------------------------

async def redis_calls(redis_url: str) -> dict[str, int]:
    """Calls per command since the server started (commands run by Lua scripts included)."""
    redis = Redis.from_url(redis_url)
    try:
        stats = await redis.info("commandstats")
    finally:
        await redis.aclose()
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def calls_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Calls made between two snapshots, without our own INFO and catalog set-up."""
    delta = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in sorted(delta.items(), key=lambda kv: -kv[1]) if v > 0 and k != "info"}


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown")
    mem_kb = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                  if line.startswith("MemTotal:"))
    return {"cores": os.cpu_count(), "memory_gb": round(mem_kb / 1024 / 1024, 1), "cpu_model": model,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
