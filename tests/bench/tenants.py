"""The tenants scenario ("Fifty thousand groups"): what a big catalog costs a fleet
that has nothing to do, and what it costs the one project that has traffic.

Catalogs of ``--tenant-sizes`` groups (1k, 10k, 50k) over up to ``MAX_PROJECTS`` projects, ten
groups a project: the bench project's two deterministic groups (``workload.DETERMINISTIC_CATALOG``:
four patterns; a code scorer plus a pattern) and filler groups of pattern members (the shared
patterns), every one live, of which

- about 44% alert by incident (``online.alertMode`` "window": the incident watch reads each one's
  window every SGW_INCIDENT_INTERVAL_S);
- the rest (about 56%) alert per result; two projects in three have an alert channel with
  ``digestSeconds`` (300), so about two thirds of those groups are digested (about 37% of all);
- one in fifty is session-scope (the session sweep looks at its project every
  SGW_SESSION_SWEEP_INTERVAL_S).

The catalog is written whole with ``MonitorClient.apply`` into a Redis database of its own. For
each size and each fleet of ``--tenant-workers`` (1, 2, 4) ``scorer-worker run`` processes in one
consumer group, on an empty topic, once the fleet's 64 shard leases are split evenly (read from
Redis, about one SGW_FLEET_LEASE_S after the last start):

1. idle CPU per worker: each worker's CPU (children included) over ``--tenant-idle-seconds``
   with no traffic, as a fraction of a core (mean and max over the fleet);
2. idle Redis commands/s: the ``INFO commandstats`` delta over the same window (commands run by
   scripts included), and the commands that make it;
3. tick time: ``INFO commandstats`` sampled every ``SAMPLE_S`` over the window; the incident
   watch is the only idle caller of HMGET (its window reads) and the digest sender the only one
   of LINDEX (its results' oldest): the longest run of samples with calls is how long a tick
   took - and so how late the next one is (``consumers.periodic.every`` waits its interval after
   a tick ends). With several workers, their ticks can overlap into one run: an upper bound;
4. change propagation: ``PATCHES`` one-group updates (``MonitorClient.scorer_groups.update``
   with a warm ``SnapshotCache``, as the API writes), from before the write to the ``catalog reloaded`` line of that version (or later) in every
   worker's log (JSON, with its own timestamp): the slowest worker, worst of the patches; and the
   event loop's stall meanwhile: the highest ``sgw_event_loop_stall_seconds`` bucket (of 10, 25,
   50, 100, 250 ms, ...) that any worker's histogram gained, from just before the write until
   a second after the last worker had it (ticks falling in that time count: what a change costs
   is what the loop is held by then). The idle window's own highest bucket is given beside it.

The idle figures count whole ticks: a window holds one or two of a worker's incident and digest
ticks (every SGW_INCIDENT_INTERVAL_S after the last ended), so with ticks a few seconds long a
figure can be off by up to a tick's share of the window; the table gives the runs seen.

Then, per size and in a 10-group catalog (the bench project's two groups and eight fillers), one
worker drains ``--tenant-traces`` traces of the bench project (its two groups; the fillers are
other projects'), measured as the deterministic scenario is (``scenarios._drain``): CPU per
trace from the first output on. The big catalog's figure includes its idle ticks meanwhile, so
``cpu_s_per_1k_less_idle`` also gives it less the 1-worker fleet's idle CPU over the drain's time.

Workers log at info here (the ``catalog reloaded`` lines), but drain at the suite's warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import statistics
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import structlog
from redis.asyncio import Redis

from adapters.stores import keys
from adapters.stores.catalog import SnapshotCache
from devtools.processes import free_port
from services.groups import MonitorClient
from tests.bench.scenarios import Bench, _drain
from tests.bench.workload import (
    DETERMINISTIC_CATALOG,
    DETERMINISTIC_GROUPS,
    ProcessTree,
    calls_delta,
    create_topics,
    produce_traces,
    redis_calls,
)
from tests.support.harness import WorkerProcess, redis_db, worker_env

MAX_PROJECTS = 5_000
GROUPS_PER_PROJECT = 10
WINDOW_PERCENT = 44  # groups alerting by incident (alertMode "window")
SESSION_EVERY = 50  # one group in this many is session-scope
DIGEST_SECONDS = 300
SAMPLE_S = 0.25  # INFO commandstats sampling during the idle window
PATCHES = 3
INCIDENT_MARK, DIGEST_MARK = "hmget", "lindex"  # the idle callers of these: the incident watch, the digests
STALL = "sgw_event_loop_stall_seconds_bucket"
# Issue 53's goals
GOAL_IDLE_CPU = 0.10
GOAL_PROPAGATION_S = 1.0
GOAL_STALL_S = 0.05


def _pick(name: str, percent: int) -> bool:
    """A stable share of names (crc32), independent of the others' picks."""
    return zlib.crc32(name.encode()) % 100 < percent


def tenants_catalog(groups: int) -> dict[str, Any]:
    """``groups`` groups: the bench project's two deterministic ones and fillers over
    ``groups / GROUPS_PER_PROJECT`` other projects (at most MAX_PROJECTS), with digest channels."""
    catalog = copy.deepcopy(DETERMINISTIC_CATALOG)
    fillers = max(0, groups - DETERMINISTIC_GROUPS)
    projects = max(1, min(MAX_PROJECTS, math.ceil(groups / GROUPS_PER_PROJECT)))
    for i in range(fillers):
        gid, project = f"t{i:05d}", f"p{i % projects:04d}"
        online: dict[str, Any] = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "low"}
        if _pick(gid, WINDOW_PERCENT):
            online["alertMode"] = "window"
        if i % SESSION_EVERY == SESSION_EVERY - 1:
            online["scope"] = "session"
        catalog["groups"].append({
            "id": gid, "name": f"Tenant group {i}", "projectId": project, "online": online,
            "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False},
                        {"kind": "pattern", "refId": "refund", "weight": 1, "gate": False}]})
    catalog["channels"] = [
        {"agentId": "support-agent", "url": f"http://127.0.0.1:9/hooks/p{p:04d}", "projectId": f"p{p:04d}",
         "digestSeconds": DIGEST_SECONDS}
        for p in range(projects) if zlib.crc32(f"p{p:04d}".encode()) % 3 != 0]
    return catalog


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Writing 50,000 documents logs one ``catalog changed`` line naming each: not on the suite's output."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        yield
    finally:
        structlog.configure(**saved)


async def _catalog_db(bench: Bench, catalog: dict[str, Any]) -> tuple[str, float]:
    """A Redis database of its own holding ``catalog``, and the seconds its write took."""
    url = redis_db(bench.redis_url, bench.next_db)
    bench.next_db += 1
    redis = Redis.from_url(url)
    try:
        await redis.flushdb()
        started = time.monotonic()
        with _quiet():
            await MonitorClient(redis).apply(catalog)
        return url, time.monotonic() - started
    finally:
        await redis.aclose()


def _worker(bench: Bench, name: str, redis_url: str, topic: str, instance: int) -> WorkerProcess:
    """``Bench.worker`` at log level info (its ``catalog reloaded`` lines)."""
    settings: dict[str, object] = {"topic_partitions": 6, "log_level": "warning", "code_sandboxes": bench.sandboxes,
                                   **bench.worker_settings}
    settings["log_level"] = "info"
    env = worker_env(bench.bootstrap, redis_url, bench.name(name), **settings)
    env["SGW_TRACES_TOPIC"] = topic
    return WorkerProcess(env, name=f"{name}-{instance}", metrics_port=free_port()).start(bench.logs)


async def _settled(redis: Redis, workers: int, timeout_s: float) -> float | None:
    """Wait until the 64 shard leases are held, each worker holding its fair share; the seconds
    waited, or None at the timeout."""
    fair = math.ceil(keys.SHARDS / workers)
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        seconds, micros = await redis.time()
        now_ms = seconds * 1000 + micros // 1000
        held: Counter[str] = Counter()
        for raw in (await redis.hgetall(keys.FLEET_LEASES)).values():
            who, _, ends = (raw.decode() if isinstance(raw, bytes) else raw).rpartition(" ")
            if int(ends) > now_ms:
                held[who] += 1
        if sum(held.values()) == keys.SHARDS and len(held) == workers and max(held.values()) <= fair:
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    return None


def _stall_buckets(worker: WorkerProcess) -> dict[str, float]:
    """The event-loop stall histogram's cumulative buckets: le -> count."""
    out = {}
    for line in worker.metrics().splitlines():
        if line.startswith(STALL + "{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[le] = float(line.rsplit(" ", 1)[1])
    return out


def _worst_stall(before: list[dict[str, float]], after: list[dict[str, float]]) -> str:
    """The highest bucket any worker's stall histogram gained between the two reads: "<= 0.05"
    (every stall at most 50 ms), "> 10" past the last bucket."""
    worst = 0.0
    for b, a in zip(before, after, strict=True):
        gained = {le: a[le] - b.get(le, 0) for le in a}
        total = gained.get("+Inf", 0)
        bounds = sorted((float(le), le) for le in gained if le != "+Inf")
        if total:
            worst = max(worst, next((bound for bound, le in bounds if gained[le] >= total), math.inf))
    last = max((float(le) for le in before[0] if le != "+Inf"), default=0.0)
    return f"> {last:g}" if worst == math.inf else f"<= {worst:g}"


def _stall_s(text: str) -> float:
    """The upper bound of a ``_worst_stall`` answer, in seconds (inf past the last bucket)."""
    return math.inf if text.startswith(">") else float(text.split()[-1])


class CommandSampler:
    """``INFO commandstats`` every SAMPLE_S: the runs of samples in which a command was called."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        self.samples: list[tuple[float, dict[str, int]]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> CommandSampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            self.samples.append((time.monotonic(), await redis_calls(self.redis_url)))
            await asyncio.sleep(SAMPLE_S)

    async def stop(self) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def longest_run_s(self, command: str) -> tuple[float, int, bool]:
        """(the longest run of samples with calls of ``command``, in seconds; how many runs; whether
        the longest is cut by the window's ends - the tick is longer than that)."""
        runs: list[tuple[float, bool]] = []
        start: float | None = None
        cut_start = False
        for i in range(1, len(self.samples)):
            (t0, a), (_, b) = self.samples[i - 1], self.samples[i]
            active = b.get(command, 0) > a.get(command, 0)
            if active and start is None:
                start = t0
                cut_start = i == 1
            if not active and start is not None:
                runs.append((t0 - start, cut_start))
                start = None
        if start is not None:
            runs.append((self.samples[-1][0] - start, True))
        if not runs:
            return 0.0, 0, False
        longest = max(runs)
        return longest[0], len(runs), longest[1]


class LogTail:
    """The ``catalog reloaded`` lines a worker logs from now on: version -> when (its timestamp)."""

    def __init__(self, worker: WorkerProcess) -> None:
        assert worker.log_path is not None
        self.path: Path = worker.log_path
        self.offset = self.path.stat().st_size
        self.reloaded: dict[int, float] = {}

    def read(self) -> None:
        with self.path.open("rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            if b'"catalog reloaded"' in line:
                entry = orjson.loads(line)
                self.reloaded[int(entry["version"])] = datetime.fromisoformat(entry["timestamp"]).timestamp()

    def seen(self, version: int) -> float | None:
        return min((t for v, t in self.reloaded.items() if v >= version), default=None)


async def _propagate(redis_url: str, workers: list[WorkerProcess], group_id: str) -> dict[str, Any]:
    """PATCHES one-group updates, each timed to every worker's reload of it; the loop's stall."""
    redis = Redis.from_url(redis_url)
    # As the API writes: with its process's snapshot, so a write reads and validates what changed.
    client = MonitorClient(redis, cache=SnapshotCache())
    store = client.store
    times, writes = [], []
    try:
        await store.snapshot()
        tails = [LogTail(w) for w in workers]
        before = [await asyncio.to_thread(_stall_buckets, w) for w in workers]
        for n in range(PATCHES):
            started = time.time()
            with _quiet():
                await client.scorer_groups.update(group_id, description=f"patch {n} at {started}")
            writes.append(time.time() - started)
            version = await store.version()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for tail in tails:
                    tail.read()
                if all(tail.seen(version) is not None for tail in tails):
                    break
                await asyncio.sleep(0.02)
            seen = [tail.seen(version) for tail in tails]
            times.append(max(t - started for t in seen) if all(t is not None for t in seen) else math.inf)  # type: ignore[operator]
            await asyncio.sleep(1.0)
        after = [await asyncio.to_thread(_stall_buckets, w) for w in workers]
    finally:
        await redis.aclose()
    return {"propagation_s": round(max(times), 3), "propagation_s_each": [round(t, 3) for t in times],
            "write_s": round(max(writes), 3), "stall_during_change": _worst_stall(before, after)}


async def _fleet(bench: Bench, size: int, redis_url: str, topic: str, workers: int,
                 idle_s: float) -> dict[str, Any]:
    name = f"tenants-{size}-x{workers}"
    fleet = [_worker(bench, name, redis_url, topic, i) for i in range(workers)]
    redis = Redis.from_url(redis_url)
    try:
        started = time.monotonic()
        for worker in fleet:
            await asyncio.to_thread(worker.wait_ready, 180)
        ready_s = time.monotonic() - started
        settle_s = await _settled(redis, workers, timeout_s=90)
        await asyncio.sleep(2.0)  # a renewal's give-and-take done
        trees = [ProcessTree(w.proc.pid).start() for w in fleet if w.proc is not None]
        stall_before = [await asyncio.to_thread(_stall_buckets, w) for w in fleet]
        sampler = CommandSampler(redis_url).start()
        for tree in trees:
            tree.mark()
        before, marked = await redis_calls(redis_url), time.monotonic()
        await asyncio.sleep(idle_s)
        cpu = [tree.cpu_s() for tree in trees]
        wall = time.monotonic() - marked
        after = await redis_calls(redis_url)
        waited = sum(tree.waited_s() for tree in trees)
        await sampler.stop()
        for tree in trees:
            tree.stop()
        stall_after = [await asyncio.to_thread(_stall_buckets, w) for w in fleet]
        calls = calls_delta(before, after)
        incident_s, incident_runs, incident_cut = sampler.longest_run_s(INCIDENT_MARK)
        digest_s, digest_runs, digest_cut = sampler.longest_run_s(DIGEST_MARK)
        change = await _propagate(redis_url, fleet, "t00000")
        alive = all(w.proc is not None and w.proc.poll() is None for w in fleet)
    finally:
        await redis.aclose()
        for worker in fleet:
            worker.stop(timeout_s=120)
    shares = [c / wall for c in cpu]
    return {
        "workers": workers, "ready_s": round(ready_s, 1),
        "settle_s": round(settle_s, 1) if settle_s is not None else None, "idle_window_s": round(wall, 1),
        "idle_cpu_per_worker": round(statistics.mean(shares), 3), "idle_cpu_max_worker": round(max(shares), 3),
        "idle_cpu_each": [round(s, 3) for s in shares], "cpu_starved": round(waited / wall, 2),
        "idle_redis_cmds_per_s": round(sum(calls.values()) / wall, 1),
        "idle_redis_commands_per_s": {k: round(v / wall, 1) for k, v in list(calls.items())[:8]},
        "incident_tick_s": round(incident_s, 2), "incident_tick_runs": incident_runs,
        "incident_tick_cut": incident_cut, "digest_tick_s": round(digest_s, 2), "digest_tick_runs": digest_runs,
        "digest_tick_cut": digest_cut, "idle_stall": _worst_stall(stall_before, stall_after),
        **change, "alive_to_the_end": alive,
    }


async def _per_trace(bench: Bench, label: str, redis_url: str, topic: str, traces: int) -> dict[str, Any]:
    """One worker drains the bench project's ``traces`` (its two groups) at the suite's settings."""
    ratings = bench.name(f"tenants-{label}-ratings")
    await create_topics(bench.bootstrap, [ratings], log_append_time=True)
    worker = bench.worker(f"tenants-{label}-drain", redis_url, topic=topic, ratings_topic=ratings)
    proc = worker.proc
    assert proc is not None
    try:
        return await _drain(bench, proc.pid, lambda: proc.poll() is None, ratings, traces, DETERMINISTIC_GROUPS,
                            redis_url)
    finally:
        worker.stop(timeout_s=120)


def _shape(catalog: dict[str, Any]) -> dict[str, int]:
    digested = {c["projectId"] for c in catalog["channels"]}
    groups = catalog["groups"]
    return {"groups": len(groups), "projects": len({g["projectId"] for g in groups}),
            "window_groups": sum(g["online"].get("alertMode") == "window" for g in groups),
            "digested_groups": sum(g["online"].get("alertMode", "each") == "each" and g["projectId"] in digested
                                   for g in groups),
            "session_groups": sum(g["online"].get("scope") == "session" for g in groups),
            "digest_channels": len(catalog["channels"])}


async def tenants(bench: Bench, sizes: list[int], fleets: list[int], idle_s: float, traces: int) -> dict[str, Any]:
    idle_topic, traces_topic = bench.name("tenants-idle"), bench.name("tenants-traces")
    await create_topics(bench.bootstrap, [idle_topic, traces_topic])
    await produce_traces(bench.bootstrap, traces_topic, 0, traces)
    result: dict[str, Any] = {"traces": traces, "idle_window_s": idle_s, "sizes": {}}
    url, _ = await _catalog_db(bench, tenants_catalog(10))
    base = result["baseline_10_groups"] = await _per_trace(bench, "10", url, traces_topic, traces)
    print(f"  10 groups: {base['cpu_s_per_1k']} CPU s / 1k traces", flush=True)
    for size in sizes:
        catalog = tenants_catalog(size)
        url, apply_s = await _catalog_db(bench, catalog)
        entry: dict[str, Any] = {**_shape(catalog), "apply_s": round(apply_s, 1), "fleets": {}}
        result["sizes"][str(size)] = entry
        print(f"  {size:,} groups: {entry}", flush=True)
        for workers in fleets:
            fleet = entry["fleets"][str(workers)] = await _fleet(bench, size, url, idle_topic, workers, idle_s)
            print(f"  {size:,} groups x {workers}: {fleet}", flush=True)
        drain = entry["per_trace"] = await _per_trace(bench, str(size), url, traces_topic, traces)
        idle = entry["fleets"].get("1", {}).get("idle_cpu_per_worker")
        # Less the idle ticks' CPU - unless they took the drain's core (then the trace loop ran in
        # what they left: the raw figure is all there is).
        if idle is not None and drain.get("cpu_cores_used") and idle < 0.9 * drain["cpu_cores_used"]:
            drain["cpu_s_per_1k_less_idle"] = round(drain["cpu_s_per_1k"] * (1 - idle / drain["cpu_cores_used"]), 3)
        figure = drain.get("cpu_s_per_1k_less_idle", drain["cpu_s_per_1k"])
        drain["vs_10_groups"] = round(figure / base["cpu_s_per_1k"], 2) if base.get("cpu_s_per_1k") else None
        print(f"  {size:,} groups, per trace: {drain}", flush=True)
    if sizes:
        largest = result["sizes"][str(max(sizes))]
        result["cpu_s_per_1k"] = largest["per_trace"]["cpu_s_per_1k"]
    result["goal_misses"] = misses(result)
    for miss in result["goal_misses"]:
        print(f"  !! {miss}", flush=True)
    return result


def misses(result: dict[str, Any]) -> list[str]:
    """Issue 53's goals each figure misses."""
    out: list[str] = []
    sizes = sorted(result["sizes"], key=int)
    smallest = result["sizes"][sizes[0]]["fleets"] if sizes else {}
    for size in sizes:
        entry = result["sizes"][size]
        fleets = entry["fleets"]
        counts = sorted(fleets, key=int)
        for n in counts:
            f = fleets[n]
            at = f"{int(size):,} groups x {n} workers"
            if f["idle_cpu_max_worker"] >= GOAL_IDLE_CPU:
                out.append(f"{at}: idle CPU {f['idle_cpu_max_worker']:.1%} of a core on the busiest worker "
                           f"(goal < {GOAL_IDLE_CPU:.0%})")
            small = smallest.get(n, {}).get("idle_redis_cmds_per_s")
            if small and size != sizes[0] and f["idle_redis_cmds_per_s"] > 2 * small:
                out.append(f"{at}: idle Redis {f['idle_redis_cmds_per_s']:,.0f} commands/s, "
                           f"{f['idle_redis_cmds_per_s'] / small:.0f}x the {int(sizes[0]):,}-group catalog's "
                           "(goal: by groups with traffic - there is none)")
            if f["propagation_s"] > GOAL_PROPAGATION_S:
                out.append(f"{at}: a change reached every worker in {f['propagation_s']} s (goal < 1 s)")
            if _stall_s(f["stall_during_change"]) > GOAL_STALL_S:
                out.append(f"{at}: event loop stalled {f['stall_during_change']} s during the change "
                           f"(goal <= {GOAL_STALL_S} s; idle window: {f['idle_stall']})")
        if len(counts) > 1:
            first, last = fleets[counts[0]], fleets[counts[-1]]
            if last["idle_cpu_per_worker"] >= first["idle_cpu_per_worker"] * 0.9:
                out.append(f"{int(size):,} groups: idle CPU per worker does not fall with workers "
                           f"({first['idle_cpu_per_worker']:.1%} with {counts[0]}, {last['idle_cpu_per_worker']:.1%} "
                           f"with {counts[-1]})")
            if last["idle_redis_cmds_per_s"] > 1.5 * first["idle_redis_cmds_per_s"]:
                out.append(f"{int(size):,} groups: idle Redis commands grow with workers "
                           f"({first['idle_redis_cmds_per_s']:,.0f}/s with {counts[0]}, "
                           f"{last['idle_redis_cmds_per_s']:,.0f}/s with {counts[-1]})")
        vs = entry.get("per_trace", {}).get("vs_10_groups")
        if vs is not None and vs > 1.2:
            out.append(f"{int(size):,} groups: a trace of the bench project costs {vs}x its CPU in a 10-group "
                       "catalog (less the idle CPU; goal: the same)")
    return out


def notes(r: dict[str, Any]) -> str:
    """The suite table's notes for the scenario (its own table follows the suite's)."""
    return (f"{len(r['sizes'])} catalog sizes; CPU s / 1k traces is the largest catalog's (10 groups: "
            f"{r['baseline_10_groups'].get('cpu_s_per_1k')}); {len(r['goal_misses'])} of issue 53's goals missed "
            "- see the tenants table")


def table(r: dict[str, Any]) -> list[str]:
    """The scenario's own table: catalog size x workers."""
    lines = ["## tenants", "",
             f"Idle window {r['idle_window_s']} s; {r['traces']:,} traces of the bench project per drain; "
             f"10-group catalog: {r['baseline_10_groups'].get('cpu_s_per_1k')} CPU s / 1k traces.", "",
             "| groups | projects | workers | idle CPU / worker (max) | idle Redis cmds/s | top commands/s "
             "| incident tick s (runs) | digest tick s (runs) | change at every worker s (write s) | stall during change s "
             "| idle stall s "
             "| CPU s / 1k traces (less idle) | x 10 groups |",
             "|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for size, entry in r["sizes"].items():
        drain = entry.get("per_trace", {})
        for n, f in entry["fleets"].items():
            top = ", ".join(f"{k} {v:,.0f}" for k, v in list(f["idle_redis_commands_per_s"].items())[:4])
            lines.append(
                f"| {int(size):,} | {entry['projects']:,} | {n} | {f['idle_cpu_per_worker']:.1%} "
                f"({f['idle_cpu_max_worker']:.1%}) | {f['idle_redis_cmds_per_s']:,.0f} | {top} | "
                f"{'>=' if f['incident_tick_cut'] else ''}{f['incident_tick_s']} ({f['incident_tick_runs']}) | "
                f"{'>=' if f['digest_tick_cut'] else ''}{f['digest_tick_s']} ({f['digest_tick_runs']}) | "
                f"{f['propagation_s']} ({f['write_s']}) | "
                f"{f['stall_during_change']} | {f['idle_stall']} | "
                + (f"{drain.get('cpu_s_per_1k')} ({drain.get('cpu_s_per_1k_less_idle')}) | {drain.get('vs_10_groups')} |"
                   if n == "1" else " | |"))
    if r["goal_misses"]:
        lines += ["", "Goals missed:", "", *(f"- {m}" for m in r["goal_misses"])]
    return lines
