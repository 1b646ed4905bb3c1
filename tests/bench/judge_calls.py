"""The judge-calls scenario: what keeping a record of every judge call costs, per call - in Redis
bytes and in CPU - measured in one run, as ratios to what the same run measures otherwise.

    .venv/bin/python -m tests.bench.suite --only judge-calls [--judge-calls-traces 2000]

The worker keeps each judge call behind a group result: the panel cuts and masks it
(``scoring.judge_calls.kept``), the outputs encode a result's calls (``encode_calls``, through
``scoring.results.history_entry``), and the ratings store keeps them in the group's index - a
sorted set (``keys.group_results_seqs``: rating id by its seq, for every result) and a hash
(``keys.group_judge_calls``: rating id -> its calls JSON, for results with calls) - trimmed with
the group's latest-results list (``keys.group_results``, ``keys.RESULTS_KEPT`` = 1,000 results).

1. **Redis bytes** (``redis``). A worker with the judge-bound scenario's group (one judge: one call
   per trace), started as ``scenarios.judge_bound`` starts it - against devtools/judge_server.py in
   its own process (``JudgeProcess``, 300 ms) at SGW_JUDGE_CONCURRENCY 64 - drains
   ``--judge-calls-traces`` (2,000) of the workload's ~2 KB traces from a topic of its own: past
   the 1,000 results the list keeps, so the list and its index have been trimmed. Once the worker
   has stopped: ``MEMORY USAGE ... SAMPLES 0`` (every element counted) of the index over the calls
   it holds (its values parsed), of the list over the results it holds, and the mean encoded size
   of one call record. The index has an entry per result with or without calls (it finds a
   result by its rating id), so ``redis_bytes_per_kept_call`` is the index's bytes per call less
   the bytes per result of an index written without calls (step 3). The drain also gives the
   worker's whole CPU per judge call (as the spend scenario measures a drain: from the first
   rating on, the process and its children). The local judge answers ``{"rating": ..,
   "justification": "Scripted judge answer"}``: these records hold a shorter answer than a real
   judge's (step 2's answer is ~300 characters).
2. **CPU in-process** (``keep_us``, as tests/bench/bench_pure.py measures the pure path): in this
   process, with the worker's collector thresholds, the median of ``ROUNDS`` rounds of
   ``time.process_time`` over 256 calls - the messages ``scoring.judge_prompt.build_messages``
   builds for the judge from the Subjects of 256 workload traces (decoded and routed as the
   worker does them), a ~300-character answer and its usage; a Redactor as
   ``worker.engine.redactor`` builds it from settings that hold a few secrets. Per call:
   ``record`` (the JudgeCall the judge client records of the messages it sent), ``kept`` (cut and
   masked), ``encode`` (``encode_calls`` of a one-call result, as ``history_entry`` does).
   ``keep_long_us``: the same for traces whose answer is 20,000 characters (the judge's user
   message is then cut at 4,000).
3. **Redis write** (``write``): ``RatingsStore.write`` of batches of ``WRITE_BATCH`` HistoryEntry -
   the worker's own documents from step 1 under fresh rating ids, with step 2's encoded calls,
   and the same entries with ``calls=b""`` - each into a group of its own whose list is already
   full (trimming every write), the variants in turn, in a fresh database of the suite's Redis.
   Per entry: the client's CPU (``time.process_time``), wall time, the Redis server's CPU
   (``INFO cpu``, used_cpu_user + used_cpu_sys: Redis runs on this machine too) and the commands
   it ran (``INFO commandstats``, those run by the script included, as the suite counts them);
   ``diff`` is with minus without; ``index_diff`` is without minus entries with no rating id
   either (``no_index``: the script then writes no index entry - the index's own cost). Then ``MEMORY USAGE`` of both indexes: bytes per result with
   the ~300-character answers over without (``redis_bytes_per_kept_call_real_answer``).

``keep_cpu_us_per_call`` is what keeping costs the worker's process per call: record + kept +
encode + the write's client CPU difference (one call per result here). It is given over the
worker's CPU per judge call of step 1 (``keep_vs_worker_call``) and over the limit stage's CPU per
trace in the same run (``keep_vs_limit_trace``: the suite runs the limit stage first when
``--only`` leaves it out); the Redis server's share is given apart (``redis_cpu_us_per_call``).
Prints the figures; asserts nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
from redis.asyncio import Redis

from adapters.stores import keys
from adapters.stores.ratings import RatingsStore
from consumers.decode import decode_trace
from scoring.catalog import CatalogSnapshot
from scoring.judge_calls import CALL_TEXT_MAX_CHARS, encode_calls, kept
from scoring.judge_prompt import build_messages
from scoring.models import Judge, ScorerGroup
from scoring.ports import JudgeCall, TokenUsage
from scoring.results import HistoryEntry, derived_id
from scoring.routing import trace_pairs
from scoring.subjects import Subject
from tests.bench import scenarios
from tests.bench.scenarios import JUDGE_LATENCY_S, Bench, JudgeProcess
from tests.bench.workload import JUDGE_CATALOG, create_topics, produce_traces, trace_value
from worker.app import GC_THRESHOLDS
from worker.engine import redactor
from worker.settings import Settings

JUDGE_CONCURRENCY = 64
GROUP_ID = JUDGE_CATALOG["groups"][0]["id"]
JUDGE = JUDGE_CATALOG["judges"][0]
CALLS = 256  # distinct calls timed in-process
ROUNDS = 5
MIN_ROUND_S = 0.3  # each round repeats its calls for at least this much CPU
LONG_OUTPUT_CHARS = 20_000
WRITE_BATCH = 32
WRITE_ROUNDS = 6  # each of the three variants first, middle and last twice
WRITE_BATCHES = 200  # per variant and round: 6,400 entries, a few tenths of a second
MODEL = "gpt-4o-mini"  # the worker's default judge model

# Secrets as an operator's settings hold them: the redactor masks each by value, besides the
# shapes every published reason is cut of.
_SETTINGS_SECRETS: dict[str, Any] = {
    "judge_api_key": "sk-proj-Zq81bench0c4f2a9d7e6b5c4d3e2f1a0",
    "kafka_sasl_password": "kafka-bench-s3cret",
    "judge_extra_headers": '{"X-Gateway-Key": "gw-7f3a9c2e1b"}',
    "redis_url": "redis://:redis-bench-pw@127.0.0.1:6379/0",
}


def _answer(n: int) -> str:
    """A judge's answer as a real one reads (~300 characters), not the local judge's stub."""
    return orjson.dumps({"rating": 4, "justification": (
        f"The agent answers the question about order {n}: it says how to print a return label from the "
        "account page and when the refund arrives. It does not check which items are being returned or "
        "offer an exchange, which the customer did not ask for; the tone is polite and precise.")}).decode()


def _subjects(count: int) -> tuple[Judge, list[Subject]]:
    """The judge and the Subjects the worker routes to it from workload traces 0..count-1."""
    snapshot = CatalogSnapshot(
        version=1, judges={j["id"]: Judge.model_validate(j) for j in JUDGE_CATALOG["judges"]},
        groups={f"{g['projectId']}/{g['id']}": ScorerGroup.model_validate(g) for g in JUDGE_CATALOG["groups"]})
    subjects: list[Subject] = []
    for n in range(count):
        trace = decode_trace("traces", 0, n, None, trace_value(n), 1 << 20)
        subjects.extend(pair.subject for pair in trace_pairs(trace, snapshot))  # type: ignore[arg-type]
    return snapshot.judges[JUDGE["id"]], subjects


def _record(messages: list[dict[str, str]], answer: str, usage: TokenUsage) -> JudgeCall:
    """What the judge client records of a call it made (adapters.members.judge)."""
    return JudgeCall(MODEL, tuple((m["role"], m["content"]) for m in messages), answer, time.time(), 0.3, 1,
                     usage, None)


def _cpu_us(step: Callable[[Any], object], items: Sequence[Any]) -> float:
    """CPU microseconds per item of ``step``: the median of ROUNDS rounds, each at least
    MIN_ROUND_S of CPU."""
    t0 = time.process_time()
    for item in items:
        step(item)
    once = max(1e-6, time.process_time() - t0)
    repeats = max(1, int(MIN_ROUND_S / once))
    rounds = []
    for _ in range(ROUNDS):
        t0 = time.process_time()
        for _ in range(repeats):
            for item in items:
                step(item)
        rounds.append((time.process_time() - t0) / (repeats * len(items)) * 1e6)
    return statistics.median(rounds)


def _keep_costs(judge: Judge, subjects: list[Subject]) -> tuple[dict[str, float], list[bytes]]:
    """record / kept / encode, CPU us per call, and each call's encoded result (one call a result)."""
    redact = redactor(Settings(**_SETTINGS_SECRETS))
    made = []  # (messages sent, answer, usage) per call
    for n, subject in enumerate(subjects):
        messages, answer = build_messages(judge, subject), _answer(n)
        made.append((messages, answer, TokenUsage(sum(len(m["content"]) for m in messages) // 4, len(answer) // 4)))
    calls = [_record(*call) for call in made]
    keeps = [kept(c, redact) for c in calls]
    label = JUDGE["name"]  # the member's name in the result: the judge's, as the group saved none

    def encode(call: JudgeCall) -> bytes:
        return encode_calls([(JUDGE["id"], label, (call,))])

    thresholds = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)  # the worker's, as bench_pure runs
    try:
        us = {"record": _cpu_us(lambda call: _record(*call), made),
              "kept": _cpu_us(lambda c: kept(c, redact), calls),
              "encode": _cpu_us(encode, keeps)}
    finally:
        gc.set_threshold(*thresholds)
    us = {k: round(v, 2) for k, v in us.items()}
    us["total"] = round(sum(us.values()), 2)
    return us, [encode(k) for k in keeps]


# --- 1. the worker: Redis bytes -------------------------------------------------------------------

async def _redis_bytes(redis_url: str) -> tuple[dict[str, Any], list[bytes]]:
    """The index's and the list's bytes, per call and per result; and the list's items."""
    redis = Redis.from_url(redis_url)
    try:
        seqs, held, latest = (keys.group_results_seqs(GROUP_ID), keys.group_judge_calls(GROUP_ID),
                              keys.group_results(GROUP_ID))
        index_bytes = (await redis.memory_usage(seqs, samples=0) or 0) + (await redis.memory_usage(held, samples=0) or 0)
        list_bytes = await redis.memory_usage(latest, samples=0) or 0
        entries: dict[bytes, bytes] = await redis.hgetall(held)  # type: ignore[assignment]
        results = await redis.llen(latest)
        items: list[bytes] = await redis.lrange(latest, 0, -1)  # type: ignore[assignment]
    finally:
        await redis.aclose()
    records, payload, arrays = [], 0, 0
    for field, value in entries.items():
        payload += len(field) + len(value)
        calls_json = value
        arrays += len(calls_json)
        records += [len(orjson.dumps(call)) for call in orjson.loads(calls_json)]
    calls = len(records)
    return {"index_bytes": index_bytes, "index_entries": len(entries), "index_calls": calls,
            "index_bytes_per_call": round(index_bytes / max(1, calls), 1),
            # what the hash holds (fields and values as written) per call, and Redis's overhead on it
            "index_payload_bytes_per_call": round(payload / max(1, calls), 1),
            "index_overhead": round(index_bytes / max(1, payload), 3),
            "record_bytes_mean": round(statistics.fmean(records), 1) if records else None,
            "calls_json_bytes_per_call": round(arrays / max(1, calls), 1),
            "list_bytes": list_bytes, "list_results": results,
            "list_bytes_per_result": round(list_bytes / max(1, results), 1),
            "index_vs_list": round(index_bytes / max(1, list_bytes), 3)}, items


async def _worker_run(bench: Bench, traces: int) -> tuple[dict[str, Any], dict[str, Any], list[bytes]]:
    topic, ratings = bench.name("judge-calls-traces"), bench.name("judge-calls-ratings")
    await create_topics(bench.bootstrap, [topic])
    await create_topics(bench.bootstrap, [ratings], log_append_time=True)
    await produce_traces(bench.bootstrap, topic, 0, traces)
    redis_url = await bench.fresh_db(JUDGE_CATALOG)
    judge = JudgeProcess(bench, JUDGE_LATENCY_S)
    try:
        await asyncio.sleep(0.6)  # the judge process prints its count every 0.25 s
        calls_before = judge.count[1]
        worker = bench.worker("judge-calls", redis_url, topic=topic, ratings_topic=ratings,
                              judge_base_url=judge.base_url, judge_concurrency=JUDGE_CONCURRENCY)
        proc = worker.proc
        assert proc is not None
        try:
            drained = await scenarios._drain(bench, proc.pid, lambda: proc.poll() is None, ratings, traces, 1,
                                             redis_url)
        finally:
            worker.stop(timeout_s=120)  # its last history writes made: the store is read at rest
        await asyncio.sleep(0.6)
        drained["judge_calls"] = judge.count[1] - calls_before
    finally:
        judge.stop()
    stored, items = await _redis_bytes(redis_url)
    return drained, stored, items


# --- 3. RatingsStore.write with and without calls --------------------------------------------------

async def _server(redis: Redis) -> tuple[float, int]:
    """The Redis server's CPU seconds and the commands it has run (those run by scripts included,
    our INFO not)."""
    cpu, stats = await redis.info("cpu"), await redis.info("commandstats")
    commands = sum(int(v["calls"]) for name, v in stats.items() if name != "cmdstat_info")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), commands


def _documents(items: list[bytes]) -> list[tuple[bytes, str, float | None]]:
    """The worker's published documents from its list ("<seq>:<flag>:<document>"): each with its
    rating id and rating."""
    out = []
    for item in items:
        document = item.split(b":", 2)[2]
        parsed = orjson.loads(document)
        out.append((document, parsed["id"], parsed.get("rating")))
    return out


async def _write_costs(bench: Bench, documents: list[tuple[bytes, str, float | None]],
                       encoded: list[bytes]) -> dict[str, Any]:
    redis_url = await bench.fresh_db(JUDGE_CATALOG)
    redis = Redis.from_url(redis_url)
    store = RatingsStore(redis)
    # with: the calls; without: calls=b"" (the index still finds the result by its rating id);
    # no_index: no rating id either, so no index entry (as before the index: its own cost).
    groups = {"with": "calls-kept", "without": "calls-none", "no_index": "no-index"}
    made = 0

    def batch(variant: str, size: int) -> list[HistoryEntry]:
        nonlocal made
        entries = []
        for _ in range(size):
            document, rid, rating = documents[made % len(documents)]
            fresh = derived_id(f"bench-write:{made}")  # as long as a rating id; leads the document as one
            entries.append(HistoryEntry(groups[variant], rating, False, time.time(),
                                        document.replace(rid.encode(), fresh.encode(), 1),
                                        rating_id="" if variant == "no_index" else fresh,
                                        calls=encoded[made % len(encoded)] if variant == "with" else b""))
            made += 1
        return entries

    spent = {v: {"client_cpu_s": 0.0, "wall_s": 0.0, "server_cpu_s": 0.0, "commands": 0, "entries": 0}
             for v in groups}
    try:
        for variant in groups:  # the lists full (each write trims), the scripts loaded
            for _ in range(keys.RESULTS_KEPT // WRITE_BATCH + 2):
                await store.write(batch(variant, WRITE_BATCH))
        order = list(groups)
        for r in range(WRITE_ROUNDS):
            for variant in order[r % 3:] + order[:r % 3]:  # each variant first, middle and last in turn
                batches = [batch(variant, WRITE_BATCH) for _ in range(WRITE_BATCHES)]
                server_cpu, commands = await _server(redis)
                cpu, wall = 0.0, 0.0
                for entries in batches:
                    c0, w0 = time.process_time(), time.perf_counter()
                    await store.write(entries)
                    cpu += time.process_time() - c0
                    wall += time.perf_counter() - w0
                server_cpu_after, commands_after = await _server(redis)
                s = spent[variant]
                s["server_cpu_s"] += server_cpu_after - server_cpu
                s["commands"] += commands_after - commands
                s["client_cpu_s"] += cpu
                s["wall_s"] += wall
                s["entries"] += WRITE_BATCH * WRITE_BATCHES
        # The index holds an entry per result either way (it finds a result by its rating id):
        # its bytes with calls over its bytes without are what the calls cost.
        held: dict[str, tuple[int, int]] = {}  # variant -> (index bytes, index entries)
        for variant, group in groups.items():
            seqs, calls = keys.group_results_seqs(group), keys.group_judge_calls(group)
            size = (await redis.memory_usage(seqs, samples=0) or 0) + (await redis.memory_usage(calls, samples=0) or 0)
            held[variant] = (size, await redis.zcard(seqs))
    finally:
        await redis.aclose()
    per = {v: {"client_cpu_us": round(s["client_cpu_s"] / s["entries"] * 1e6, 2),
               "wall_us": round(s["wall_s"] / s["entries"] * 1e6, 2),
               "server_cpu_us": round(s["server_cpu_s"] / s["entries"] * 1e6, 2),
               "redis_cmds": round(s["commands"] / s["entries"], 3)} for v, s in spent.items()}
    for variant, (size, held_entries) in held.items():
        per[variant]["index_bytes_per_result"] = round(size / max(1, held_entries), 1)
    return {"batch": WRITE_BATCH, "entries_per_variant": spent["with"]["entries"], "index_entries": held["with"][1],
            **per, "diff": {k: round(per["with"][k] - per["without"][k], 2) for k in per["with"]},
            "index_diff": {k: round(per["without"][k] - per["no_index"][k], 2) for k in per["with"]}}


# --- the scenario ----------------------------------------------------------------------------------

async def judge_calls(bench: Bench, traces: int, limit_cpu_s_per_1k: float | None = None) -> dict[str, Any]:
    if traces <= keys.RESULTS_KEPT:
        print(f"  !! {traces} traces: the list keeps {keys.RESULTS_KEPT:,}, so nothing is trimmed", flush=True)
    drained, stored, items = await _worker_run(bench, traces)
    judge, subjects = _subjects(CALLS)
    keep_us, encoded = _keep_costs(judge, subjects)
    long_subjects = [dataclasses.replace(s, output=(s.output + " ") * (LONG_OUTPUT_CHARS // (len(s.output) + 1) + 1))
                     for s in subjects]
    keep_long_us, encoded_long = _keep_costs(judge, long_subjects)
    write = await _write_costs(bench, _documents(items), encoded)

    keep_cpu_us = round(keep_us["total"] + write["diff"]["client_cpu_us"], 2)
    worker_us = drained["cpu_s_per_1k"] * 1000  # CPU ms per judge call -> us
    limit_us = limit_cpu_s_per_1k * 1000 if limit_cpu_s_per_1k else None
    # The index keeps an entry per result with or without calls (rating id -> "<seq>:"): what the
    # calls add is its size over that of the index written without them (step 3).
    locator = write["without"]["index_bytes_per_result"]
    result: dict[str, Any] = {
        **drained, "redis": stored,
        "redis_bytes_per_kept_call": round(stored["index_bytes_per_call"] - locator, 1),
        "redis_bytes_per_kept_call_real_answer": round(write["with"]["index_bytes_per_result"] - locator, 1),
        "keep_us": keep_us, "record_bytes_encoded": round(statistics.fmean(map(len, encoded)), 1),
        "keep_long_us": keep_long_us, "record_long_bytes_encoded": round(statistics.fmean(map(len, encoded_long)), 1),
        "long_cut_at": CALL_TEXT_MAX_CHARS, "write": write,
        "keep_cpu_us_per_call": keep_cpu_us, "redis_cpu_us_per_call": write["diff"]["server_cpu_us"],
        "keep_vs_worker_call": round(keep_cpu_us / worker_us, 4) if worker_us else None,
        "keep_vs_limit_trace": round(keep_cpu_us / limit_us, 3) if limit_us else None,
        "worker_call_vs_limit_trace": round(worker_us / limit_us, 2) if limit_us else None,
    }
    print(summary(result), flush=True)
    return result


def summary(r: dict[str, Any]) -> str:
    s, k, w = r["redis"], r["keep_us"], r["write"]
    return "\n".join([
        f"  Redis: index {s['index_bytes']:,} B for {s['index_calls']:,} calls = {s['index_bytes_per_call']:,} B a call "
        f"(record {s['record_bytes_mean']:,} B encoded; {s['index_overhead']}x what it holds); list "
        f"{s['list_bytes']:,} B for {s['list_results']:,} results = {s['list_bytes_per_result']:,} B a result; "
        f"an index without calls {w['without']['index_bytes_per_result']:,} B a result: the calls add "
        f"{r['redis_bytes_per_kept_call']:,} B a call ({r['redis_bytes_per_kept_call_real_answer']:,} B with a "
        f"~300-char answer, {w['with']['index_bytes_per_result']:,} B a result)",
        f"  in-process CPU us a call: record {k['record']}, kept {k['kept']}, encode {k['encode']} = {k['total']} "
        f"({r['record_bytes_encoded']:,} B encoded); of a trace whose answer is {LONG_OUTPUT_CHARS:,} chars "
        f"{r['keep_long_us']['total']} ({r['record_long_bytes_encoded']:,} B)",
        f"  RatingsStore.write per entry, with / without calls: client CPU {w['with']['client_cpu_us']} / "
        f"{w['without']['client_cpu_us']} us, wall {w['with']['wall_us']} / {w['without']['wall_us']} us, Redis CPU "
        f"{w['with']['server_cpu_us']} / {w['without']['server_cpu_us']} us, Redis commands "
        f"{w['with']['redis_cmds']} / {w['without']['redis_cmds']}; the index entry itself (without / no index): "
        f"client CPU +{w['index_diff']['client_cpu_us']} us, wall +{w['index_diff']['wall_us']} us, Redis CPU "
        f"+{w['index_diff']['server_cpu_us']} us, Redis commands +{w['index_diff']['redis_cmds']}",
        f"  keeping: {r['keep_cpu_us_per_call']} us of the worker's CPU a call = {r['keep_vs_worker_call']} of its "
        f"{r['cpu_s_per_1k'] * 1000:.0f} us a judge call, {r['keep_vs_limit_trace']}x the limit stage's CPU a trace; "
        f"+ {r['redis_cpu_us_per_call']} us of Redis CPU"])
