"""The suite's scenarios. Each runs what it measures as its own process (the worker, the plain
aiokafka stage, the Quix peer, the judge server), reads the process tree's CPU and memory from
/proc, and counts outputs by their broker timestamps (output topics use LogAppendTime)."""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from devtools.processes import free_port
from services.groups import MonitorClient
from tests.bench.profile import Profile
from tests.bench.workload import (
    DETERMINISTIC_CATALOG,
    DETERMINISTIC_GROUPS,
    JUDGE_CATALOG,
    PROJECT,
    OutputTopic,
    ProcessTree,
    calls_delta,
    create_topics,
    produce_traces,
    redis_calls,
    trace_value,
)
from tests.support.harness import ROOT, WorkerProcess, redis_db, worker_env
from worker.settings import room_for

PEER_PYTHON = ROOT / ".venv-bench" / "bin" / "python"
JUDGE_LATENCY_S = 0.3


@dataclass
class Bench:
    """What every scenario shares: the services, the pre-filled topic and its size."""

    bootstrap: str
    redis_url: str
    topic: str
    traces: int
    tag: str
    logs: Path
    sandboxes: int = 2
    worker_settings: dict[str, str] = field(default_factory=dict)  # --worker-setting: over every scenario's
    next_db: int = 1
    profile_dir: Path | None = None  # --profile: a py-spy profile of each measured window, by step
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def name(self, what: str) -> str:
        return f"{what}-{self.tag}"

    async def fresh_db(self, catalog: dict[str, Any]) -> str:
        """A Redis database of its own (a scenario's done marks must not skip another's pairs)."""
        url = redis_db(self.redis_url, self.next_db)
        self.next_db += 1
        redis = Redis.from_url(url)
        try:
            await redis.flushdb()
            await MonitorClient(redis).apply(catalog)
        finally:
            await redis.aclose()
        return url

    def worker(self, name: str, redis_url: str, *, topic: str | None = None, instance: int = 0,
               **settings: object) -> WorkerProcess:
        """A worker of the consumer group ``name`` (``instance`` tells its log from its peers')."""
        env = worker_env(self.bootstrap, redis_url, self.name(name), topic_partitions=6, log_level="warning",
                         code_sandboxes=self.sandboxes, **{**settings, **self.worker_settings})
        env["SGW_TRACES_TOPIC"] = topic or self.topic
        # A port of our own: the worker logs the one it binds at info level, and the bench runs it at
        # warning (no log lines on the hot path).
        log_name = f"{name}-{instance}" if instance else name
        return WorkerProcess(env, name=log_name, metrics_port=free_port()).start(self.logs)

    def group(self, name: str) -> str:
        """The consumer group of ``worker(name)``."""
        return worker_env(self.bootstrap, self.redis_url, self.name(name))["SGW_CONSUMER_GROUP"]

    def process(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=open(self.logs / f"{name}.log", "wb"),
                                stderr=subprocess.STDOUT)


async def _drain(bench: Bench, pid: int, alive: Any, out_topic: str, traces: int, groups: int,
                 redis_url: str | None = None, peers: tuple[int, ...] = ()) -> dict[str, Any]:
    """Wait until ``traces`` x ``groups`` outputs are out; measure from the first output on (the
    CPU and memory of ``pid``, of the ``peers`` working alongside it, and of their children)."""
    tree = ProcessTree(pid, peers=peers).start()
    profile = Profile(None, None)
    expected = traces * groups
    try:
        async with OutputTopic(bench.bootstrap, out_topic) as out:
            while await out.count() == 0 and alive():
                await asyncio.sleep(0.05)
            tree.mark()
            profile = Profile.start(bench.profile_dir, out_topic.removesuffix(f"-{bench.tag}"), pid)
            marked = time.monotonic()
            first = await out.count()
            before = await redis_calls(redis_url) if redis_url else {}
            got = await out.wait_for(expected, timeout_s=max(300.0, traces / 100), alive=alive)
            cpu_s, wall_s = tree.cpu_s(), time.monotonic() - marked
            root_cpu_s = tree.root_cpu_s()
            waited_s = tree.waited_s()
            after = await redis_calls(redis_url) if redis_url else {}
            span_s = await out.span_s()
            hwm = tree.root_hwm_mb() if alive() else None
            sample = await out.last_values(50)
    finally:
        tree.stop()
        profile.stop()
    done = got / groups
    calls = calls_delta(before, after)
    result: dict[str, Any] = {
        "traces": int(done), "complete": got >= expected, "seconds": round(span_s, 2),
        "traces_per_s": round(done / span_s, 1),
        "cpu_s_per_1k": round(cpu_s / max(1, (got - first) / groups) * 1000, 3),
        "cpu_cores_used": round(cpu_s / wall_s, 2),
        # of the CPU, the measured process's own (the rest: its children - the code sandboxes)
        "own_cpu_share": round(root_cpu_s / cpu_s, 2) if cpu_s else None,
        # threads ready to run but not running, on average: high means starved by the machine's
        # load, low (with few cores used) means it waits on I/O (the broker, Redis, sandboxes)
        "cpu_starved": round(waited_s / wall_s, 2),
        "peak_rss_mb": round(hwm, 1) if hwm is not None else None,
        "tree_peak_rss_mb": round(tree.peak_rss / 2**20, 1),
    }
    if redis_url:
        result["redis_cmds_per_pair"] = round(sum(calls.values()) / max(1, got - first), 3)
        result["redis_commands"] = dict(list(calls.items())[:8])
    # A figure is only worth its results: a member that failed (a sandbox that could not start,
    # a judge that timed out) costs less than one that scored, and would flatter the CPU.
    ratings = [r for r in map(orjson.loads, sample) if isinstance(r, dict) and "members" in r]
    if ratings:
        unscored = sum(any(m["status"] != "scored" for m in r["members"]) for r in ratings)
        result["ratings_with_unscored_members"] = f"{unscored}/{len(ratings)} sampled"
        if unscored:
            print(f"  !! {unscored} of {len(ratings)} sampled ratings have a member that did not score "
                  f"(see {bench.logs})", flush=True)
    if got < expected:
        print(f"  !! only {got} of {expected} outputs (see {bench.logs})", flush=True)
    return result


async def limit(bench: Bench) -> dict[str, Any]:
    out = bench.name("limit-out")
    await create_topics(bench.bootstrap, [out], log_append_time=True)
    proc = bench.process("limit", [sys.executable, "-m", "tests.bench.limit_stage", bench.bootstrap, bench.topic,
                                   out, bench.name("limit"), str(DETERMINISTIC_GROUPS)])
    try:
        return await _drain(bench, proc.pid, lambda: proc.poll() is None, out, bench.traces, DETERMINISTIC_GROUPS)
    finally:
        _stop(proc)


async def peer(bench: Bench) -> dict[str, Any]:
    if not PEER_PYTHON.exists():
        print(f"  skipped: {PEER_PYTHON} is missing (bash tests/bench/peer_env.sh creates it)")
        return {"skipped": "no .venv-bench with quixstreams"}
    out = bench.name("peer-out")
    await create_topics(bench.bootstrap, [out], log_append_time=True)
    proc = bench.process("peer", [str(PEER_PYTHON), "-m", "tests.bench.peer_quix", bench.bootstrap, bench.topic,
                                  out, bench.name("peer")])
    try:
        return await _drain(bench, proc.pid, lambda: proc.poll() is None, out, bench.traces, DETERMINISTIC_GROUPS)
    finally:
        _stop(proc)


async def plain_peer(bench: Bench) -> dict[str, Any]:
    """The scenario written plainly with aiokafka, orjson and RE2, no project code (peer_plain)."""
    out = bench.name("plain-peer-out")
    await create_topics(bench.bootstrap, [out], log_append_time=True)
    proc = bench.process("plain-peer", [sys.executable, "-m", "tests.bench.peer_plain", bench.bootstrap,
                                        bench.topic, out, bench.name("plain-peer")])
    try:
        return await _drain(bench, proc.pid, lambda: proc.poll() is None, out, bench.traces, DETERMINISTIC_GROUPS)
    finally:
        _stop(proc)


async def _worker_drain(bench: Bench, name: str, traces: int, workers: int = 1, *,
                        topic: str | None = None, catalog: dict[str, Any] = DETERMINISTIC_CATALOG) -> dict[str, Any]:
    redis_url = await bench.fresh_db(catalog)
    ratings = bench.name(f"{name}-ratings")
    await create_topics(bench.bootstrap, [ratings], log_append_time=True)
    # Several workers share one consumer group, as an operator scales out: the partitions split.
    started = [bench.worker(name, redis_url, topic=topic, ratings_topic=ratings, instance=i) for i in range(workers)]
    pids = [w.proc.pid for w in started if w.proc is not None]
    try:
        result = await _drain(bench, pids[0], lambda: all(w.proc is not None and w.proc.poll() is None
                                                          for w in started),
                              ratings, traces, DETERMINISTIC_GROUPS, redis_url, peers=tuple(pids[1:]))
        return result | ({"workers": workers} if workers > 1 else {})
    finally:
        for worker in started:
            worker.stop(timeout_s=120)


async def deterministic(bench: Bench) -> dict[str, Any]:
    return await _worker_drain(bench, "deterministic", bench.traces)


# Three review queues watching both deterministic groups. ``reviewed``: samples of 5%, 2%
# and 1% - every result decided three times, about 8% of them kept as items: what the rule costs
# the hot path. ``reviewed_all``: below the threshold, members disagreeing by half the scale, a 2%
# sample, with room for every item - most results of this workload are kept by one queue or two:
# what keeping items costs.
def _queues(rules: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    return {**DETERMINISTIC_CATALOG, "queues": [
        {"id": f"q-{name}", "name": name, "projectId": PROJECT, "groupIds": ["patterns", "code"], "rule": rule,
         "capacity": 100_000} for name, rule in rules]}


REVIEWED_CATALOG = _queues([("five", {"sampleRate": 0.05}), ("two", {"sampleRate": 0.02}),
                            ("one", {"sampleRate": 0.01})])
REVIEWED_ALL_CATALOG = _queues([("below", {"below": True}), ("split", {"disagreement": 0.5}),
                                ("sample", {"sampleRate": 0.02})])


async def reviewed(bench: Bench) -> dict[str, Any]:
    """The deterministic scenario with three sampled review queues watching every group."""
    return await _worker_drain(bench, "reviewed", bench.traces, catalog=REVIEWED_CATALOG)


async def reviewed_all(bench: Bench) -> dict[str, Any]:
    """The deterministic scenario with three review queues keeping most results."""
    return await _worker_drain(bench, "reviewed-all", bench.traces, catalog=REVIEWED_ALL_CATALOG)


async def scale_out(bench: Bench, workers: int) -> dict[str, Any]:
    """The deterministic scenario with ``workers`` processes in one consumer group."""
    return await _worker_drain(bench, f"deterministic-x{workers}", bench.traces, workers)


async def backlog(bench: Bench, size: int) -> dict[str, Any]:
    """The pre-filled topic grown to ``size`` traces, drained by a fresh consumer group."""
    if size > bench.traces:
        print(f"  growing the topic to {size:,} traces", flush=True)
        await produce_traces(bench.bootstrap, bench.topic, bench.traces, size - bench.traces)
        bench.traces = size
    return await _worker_drain(bench, "backlog", size)


class JudgeProcess:
    """devtools/judge_server.py in its own process at a fixed latency; its answered-request count."""

    def __init__(self, bench: Bench, latency_s: float) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.bench.judge_process", str(latency_s)],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        self.base_url = self.proc.stdout.readline().decode().rsplit(" ", 1)[1].strip()
        self.count = (time.monotonic(), 0, 0)  # (when, answered so far, peak in flight)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            _, when, total, peak = line.decode().split()
            self.count = (float(when), int(total), int(peak))

    def stop(self) -> None:
        _stop(self.proc)


async def _raw_calls_per_s(base_url: str, concurrency: int, seconds: float) -> float:
    """What the judge server answers to a minimal client (asyncio streams, one keep-alive
    connection per slot): the server's own capacity, so a shortfall is known to be the worker's."""
    host, port = base_url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Rate this."}]})
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    answered = 0

    async def connection() -> None:
        nonlocal answered
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            while True:
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                answered += 1
        finally:
            writer.close()

    tasks = [asyncio.create_task(connection()) for _ in range(concurrency)]
    await asyncio.sleep(1.0)
    start, started = answered, time.monotonic()
    await asyncio.sleep(seconds)
    rate = (answered - start) / (time.monotonic() - started)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return rate


async def judge_bound(bench: Bench, concurrency: int, window_s: float,
                      latency_s: float = JUDGE_LATENCY_S) -> dict[str, Any]:
    """One judge group at ``concurrency`` calls in flight against a judge answering in ``latency_s``.
    The bench's one project may hold them all (``judge_concurrency_per_project``): the default
    keeps a sixteenth back for a second project, which would cap the ratio at 15/16."""
    judge = JudgeProcess(bench, latency_s)
    # the probe outlasts a few of the judge's answers (a 5 s judge answers nothing in 3 s)
    server_capacity = await _raw_calls_per_s(judge.base_url, concurrency, min(max(3.0, 2.5 * latency_s), window_s))
    await asyncio.sleep(0.6)  # the probe's calls counted: the worker's start from here
    probe_calls = judge.count[1]
    redis_url = await bench.fresh_db(JUDGE_CATALOG)
    # The worker's own room (derived from its judge concurrency), unless the run sets one.
    in_flight = int(bench.worker_settings.get("max_in_flight") or 0) or room_for(concurrency, 64)
    worker = bench.worker(f"judge-{concurrency}", redis_url, judge_base_url=judge.base_url,
                          judge_concurrency=concurrency, judge_concurrency_per_project=concurrency,
                          judge_timeout_s=max(30.0, 4 * latency_s))
    assert worker.proc is not None
    tree = ProcessTree(worker.proc.pid).start()
    server = ProcessTree(judge.proc.pid)
    profile = Profile(None, None)
    try:
        await asyncio.to_thread(worker.wait_ready, 90)
        while judge.count[1] == probe_calls and worker.proc.poll() is None:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # warm up: connections opened, the pipeline full
        tree.mark()
        server.mark()
        profile = Profile.start(bench.profile_dir, f"judge-{concurrency}", worker.proc.pid)
        t1, n1, _ = judge.count
        before = await redis_calls(redis_url)
        await asyncio.sleep(window_s)
        t2, n2, peak = judge.count
        after = await redis_calls(redis_url)
        cpu_s, server_cpu_s, starved = tree.cpu_s(), server.cpu_s(), tree.waited_s() / (t2 - t1)
        hwm = tree.root_hwm_mb()
        pool = {state: worker.metric("sgw_redis_connections", state=state) for state in ("in_use", "most")}
        waits = worker.metric("sgw_redis_connection_waits_total")
        outages = worker.metric("sgw_dependency_unreachable")
    finally:
        profile.stop()
        tree.stop()
        worker.stop(timeout_s=120)
        judge.stop()
    achieved, ideal = (n2 - n1) / (t2 - t1), concurrency / latency_s
    return {"concurrency": concurrency, "latency_s": latency_s, "max_in_flight": in_flight,
            "redis_pool": {"in_use_at_end": pool["in_use"], "most": pool["most"], "waits": waits},
            "outage_at_end": outages, "calls_per_s": round(achieved, 1),
            "ideal_calls_per_s": round(ideal, 1), "ratio_to_ideal": round(achieved / ideal, 3),
            "server_peak_in_flight": peak, "server_capacity_calls_per_s": round(server_capacity, 1),
            "server_cpu_share": round(server_cpu_s / (t2 - t1), 2), "cpu_cores_used": round(cpu_s / (t2 - t1), 2),
            "cpu_starved": round(starved, 2), "traces_per_s": round(achieved, 1),
            "cpu_s_per_1k": round(cpu_s / max(1, n2 - n1) * 1000, 3), "peak_rss_mb": round(hwm, 1),
            "seconds": round(t2 - t1, 2),
            # one judge call per pair: the window's commands per call are its commands per pair
            "redis_cmds_per_pair": round(sum(calls_delta(before, after).values()) / max(1, n2 - n1), 3),
            "redis_commands": dict(list(calls_delta(before, after).items())[:8])}


async def latency(bench: Bench, rate: float, seconds: float, *, name: str = "latency",
                  prepare: Callable[[str, str, str], Awaitable[None]] | None = None,
                  progress: Callable[[], Awaitable[dict[str, Any]]] | None = None) -> dict[str, Any]:
    """Open-loop production at ``rate`` traces/s to a fresh topic; produce time -> the rating's
    broker timestamp (LogAppendTime), per rating of a trace produced here. ``prepare(topic,
    redis_url, consumer group)`` runs before the worker starts (the backfill scenario puts a past
    backlog behind the group's offsets and starts a job over it); ``progress()`` is read when
    production starts and when it ends."""
    topic, ratings = bench.name(f"{name}-traces"), bench.name(f"{name}-ratings")
    await create_topics(bench.bootstrap, [topic])
    await create_topics(bench.bootstrap, [ratings], log_append_time=True)
    redis_url = await bench.fresh_db(DETERMINISTIC_CATALOG)
    if prepare is not None:
        await prepare(topic, redis_url, bench.group(name))
    worker = bench.worker(name, redis_url, topic=topic, ratings_topic=ratings)
    assert worker.proc is not None
    count = int(rate * seconds)
    sent: dict[str, int] = {}
    during: dict[str, Any] = {}
    tree = ProcessTree(worker.proc.pid).start()
    try:
        await asyncio.to_thread(worker.wait_ready, 90)
        await asyncio.sleep(2.0)  # partitions assigned, first fetch under way
        tree.mark()
        marked = time.monotonic()
        if progress is not None:
            during["at_start"] = await progress()
        producer = AIOKafkaProducer(bootstrap_servers=bench.bootstrap, linger_ms=0)
        await producer.start()
        try:
            acks, started = [], time.monotonic()
            for i in range(count):
                ahead = started + i / rate - time.monotonic()
                if ahead > 0:
                    await asyncio.sleep(ahead)
                now_ms = int(time.time() * 1000)
                n = 10_000_000 + i
                sent[f"t-{n}"] = now_ms
                acks.append(await producer.send(topic, key=f"t-{n}".encode(), value=trace_value(n),
                                                timestamp_ms=now_ms))
            produced_s = time.monotonic() - started
            await asyncio.gather(*acks)
        finally:
            await producer.stop()
        if progress is not None:
            during["at_end"] = await progress()
        async with OutputTopic(bench.bootstrap, ratings) as out:
            records = await out.records_keyed({k.encode() for k in sent}, count * DETERMINISTIC_GROUPS, timeout_s=120)
        got = len(records)
        cpu_s, starved = tree.cpu_s(), tree.waited_s() / (time.monotonic() - marked)
        hwm = tree.root_hwm_mb()
    finally:
        tree.stop()
        worker.stop(timeout_s=120)
    lat = sorted(r.timestamp - sent[r.key.decode()] for r in records)
    q = statistics.quantiles(lat, n=100) if len(lat) > 1 else lat * 99
    return {"rate": round(rate, 1), "achieved_rate": round(count / produced_s, 1), "traces": count,
            "ratings": got, "p50_ms": round(q[49]), "p99_ms": round(q[98]), "max_ms": lat[-1],
            "cpu_s_per_1k": round(cpu_s / max(1, count) * 1000, 3), "cpu_starved": round(starved, 2),
            "peak_rss_mb": round(hwm, 1)} | (
                {"progress": during} if during else {})


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- spend: what gatesFirst saves -------------------------------------------------------------

SPEND_FAILING = 0.3  # the share of traces that leak an email: the free must-pass gate fails


def spend_catalog(gates_first: bool) -> dict[str, Any]:
    """A free must-pass PII pattern and three judges (the issue's example group)."""
    judges = [{"id": j, "name": j.title(), "criteria": f"Is the answer {j}?"} for j in ("helpful", "polite", "accurate")]
    return {
        "judges": judges,
        "patterns": [{"id": "pii", "name": "PII", "polarity": "failure", "template": "email"}],
        "groups": [{"id": "spend", "name": "Spend", "projectId": "p-spend", "gatesFirst": gates_first,
                    "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 3, "severity": "low"},
                    "members": [{"kind": "pattern", "refId": "pii", "weight": 0, "gate": True},
                                *({"kind": "judge", "refId": j["id"], "weight": 1} for j in judges)]}],
    }


def spend_trace(n: int) -> bytes:
    leaks = n % 10 < SPEND_FAILING * 10
    answer = f"Your refund for order {n} is on its way." + (" Write to jane@example.com." if leaks else "")
    return orjson.dumps({"traceId": f"s-{n}", "projectId": "p-spend", "agentId": "support-agent",
                         "timestamp": "2026-12-02T13:00:00Z",
                         "spans": [{"spanId": "root", "name": "agent.run", "input": "Where is my refund?",
                                    "output": answer + " [[rating=8]]"}]})


async def spend(bench: Bench, traces: int) -> dict[str, Any]:
    """The same traffic (30% fail the free gate) through the group with and without gatesFirst:
    judge calls per trace (counted by the judge server), and the worker's CPU per trace."""
    topic = bench.name("spend-traces")
    await create_topics(bench.bootstrap, [topic])
    producer = AIOKafkaProducer(bootstrap_servers=bench.bootstrap, linger_ms=20, acks=1)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, key=f"s-{n}".encode(), value=spend_trace(n))
                               for n in range(traces)])
    finally:
        await producer.stop()
    judge = JudgeProcess(bench, 0.02)
    result: dict[str, Any] = {"traces": traces, "failing_gate": SPEND_FAILING}
    try:
        for gates_first in (False, True):
            mode = "gates_first" if gates_first else "every_member"
            redis_url = await bench.fresh_db(spend_catalog(gates_first))
            ratings = bench.name(f"spend-{mode}-ratings")
            await create_topics(bench.bootstrap, [ratings], log_append_time=True)
            await asyncio.sleep(0.5)
            calls_before = judge.count[1]
            worker = bench.worker(f"spend-{mode}", redis_url, topic=topic, ratings_topic=ratings,
                                  judge_base_url=judge.base_url, judge_concurrency=64, max_in_flight=512)
            proc = worker.proc
            assert proc is not None
            try:
                drained = await _drain(bench, proc.pid, lambda p=proc: p.poll() is None,
                                       ratings, traces, 1, redis_url)
            finally:
                worker.stop(timeout_s=120)
            await asyncio.sleep(0.6)  # the judge process prints its count every 0.25 s
            calls = judge.count[1] - calls_before
            result[mode] = {"judge_calls_per_trace": round(calls / traces, 3), "judge_calls": calls,
                            "cpu_s_per_1k": drained["cpu_s_per_1k"], "traces_per_s": drained["traces_per_s"],
                            "redis_cmds_per_pair": drained.get("redis_cmds_per_pair")}
    finally:
        judge.stop()
    every, first = result["every_member"]["judge_calls_per_trace"], result["gates_first"]["judge_calls_per_trace"]
    result["judge_calls_saved"] = round(1 - first / every, 3) if every else None
    return result
