"""The benchmark suite: every throughput figure in one invocation, on one topic.

    .venv/bin/python -m tests.bench.suite [--traces 100000] [--backlog 1000000] [--quick] [--only limit,backfill]

Starts its own Kafka and Redis (or uses SGW_KAFKA_BOOTSTRAP / SGW_REDIS_URL), pre-fills one
traces topic (6 partitions) with ``--traces`` realistic ~2 KB traces, then runs, in order:

- limit: a plain aiokafka stage (fetch, orjson-decode, produce one ~1 KB record per trace and
  group, commit) - the most any consumer of this topic can do here;
- plain_peer: the deterministic scenario written plainly with aiokafka, orjson and RE2 - no
  project code, the groups' arithmetic inline (tests/bench/peer_plain.py);
- peer: the deterministic scenario written with Quix Streams, scoring in-process with
  the project's own scoring functions (needs .venv-bench: ``bash tests/bench/peer_env.sh``);
- deterministic: ``scorer-worker run`` with two deterministic groups (four patterns; a code
  scorer plus a pattern) draining the topic;
- scale_out: the same with ``--scale-workers`` worker processes in one consumer group, as an
  operator scales out (CPU and memory summed over them; peak_rss_mb is the first one's);
- judge-bound: one judge group against devtools/judge_server.py in its own process answering in
  300 ms (``--judge-latency``; real LLM judges take 1-10 s), at SGW_JUDGE_CONCURRENCY 16, 64 and 256
  (``--judge-concurrency``): judge calls/s against concurrency / latency, the Redis pool's bound;
- latency: open-loop production at half the deterministic rate to a fresh topic; produce time
  to the rating's broker timestamp, p50 / p99 / max;
- backlog: the topic grown to ``--backlog`` traces, drained by a fresh worker: its peak RSS;
- spend: a free must-pass PII pattern and three judges (20 ms) on ``--spend-traces`` traces of
  which 30% leak an email, with and without ``gatesFirst``: judge calls per trace;
- filtered: the deterministic groups aimed at one agent (``online.filter``) drain topics where
  no trace (or one in ten) is from it, with and without routing headers: what a trace no group
  wants costs, against the limit stage (tests/bench/filtered.py);
- backfill: ``--backfill-traces`` traces at timestamps an hour back, drained live, then graded
  again by a backfill job per group (nothing live to do): the backfill's traces/s over live's
  (by the ratings' broker timestamps, and from the jobs' start to done) and its CPU per trace;
  then the latency scenario alone and while jobs over a past backlog run in the same worker:
  both p99s and the jobs' progress (tests/bench/backfill.py);
- judge-calls: what keeping a record of every judge call costs per call: the Redis bytes of a
  judge group's index of calls (and of its latest results, for comparison) once a worker has
  scored ``--judge-calls-traces`` traces against the judge process, the CPU of cutting, masking
  and encoding a call in-process, and ``RatingsStore.write`` with and without calls - as a
  share of the worker's CPU per judge call and a multiple of the limit stage's CPU per trace
  (``--only judge-calls`` runs the limit stage first for that; tests/bench/judge_calls.py);
- tenants: catalogs of ``--tenant-sizes`` groups over up to 5,000 projects, each under fleets of
  ``--tenant-workers`` idle workers: CPU per worker, Redis commands/s, the incident and digest
  ticks, how fast a one-group change reaches every worker and what it stalls; then the bench
  project's traces' CPU against a 10-group catalog (tests/bench/tenants.py). Feeds its
  own topic: ``--only tenants`` pre-fills nothing;
- verdict-cache: the judge group drains ``--cache-traces`` traces three times - each its own
  question, 30% of them repeating one of 20 FAQ answers, all repeating them: judge calls per
  trace, CPU per cached pair against a judge pair's, Redis commands per pair
  (tests/bench/verdict_cache.py). Feeds its own topics.

Each scenario reads its own consumer group and a Redis database of its own. traces/s counts
outputs by broker timestamp (output topics use LogAppendTime) from the first to the last;
cpu_s_per_1k (= CPU ms per trace; per judge call in the judge scenarios) is the CPU of the measured process and its children (sandboxes) from /proc from the
first output on; peak_rss_mb is the measured process's VmHWM; redis_cmds_per_pair is the
``INFO commandstats`` delta (commands run inside Lua scripts included) per output.

Writes tests/bench/results/bench-results.json and bench-results.md. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import orjson

from devtools.redis_servers import LocalRedis
from devtools.services import LocalKafka
from tests.bench import backfill, filtered, judge_calls, scenarios, tenants, verdict_cache
from tests.bench.scenarios import Bench
from tests.bench.workload import create_topics, machine, produce_traces

RESULTS = Path(__file__).resolve().parent / "results"
ALL = ["limit", "plain_peer", "peer", "deterministic", "reviewed", "reviewed_all", "scale_out", "judge", "latency",
       "backlog", "spend", "filtered", "backfill", "judge-calls", "tenants", "verdict-cache"]
SELF_FED = {"tenants", "verdict-cache"}  # scenarios that produce their own traces: alone, nothing is pre-filled


async def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {"deterministic_vs_limit": None, "machine": machine(),
                              "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "out"}, "scenarios": {}}
    print(f"machine: {report['machine']}", flush=True)
    with ExitStack() as stack:
        bootstrap = os.environ.get("SGW_KAFKA_BOOTSTRAP")
        redis_url = os.environ.get("SGW_REDIS_URL")
        if not bootstrap:
            kafka = LocalKafka(partitions=6).start()
            stack.callback(kafka.stop)
            bootstrap = kafka.bootstrap
        if not redis_url:
            local_redis = LocalRedis().start()
            stack.callback(local_redis.stop)
            redis_url = local_redis.url
        tag = f"bench{int(time.time())}"
        bench = Bench(bootstrap, redis_url, topic=f"traces-{tag}", traces=args.traces, tag=tag,
                      logs=Path(tempfile.mkdtemp(prefix="sgw-bench-")), sandboxes=args.sandboxes,
                      worker_settings=dict(s.split("=", 1) for s in args.worker_setting), profile_dir=args.profile)
        wanted = args.only.split(",") if args.only else ALL
        if set(wanted) <= SELF_FED:
            print(f"logs in {bench.logs}", flush=True)
        else:
            print(f"logs in {bench.logs}; pre-filling {args.traces:,} traces", flush=True)
            await create_topics(bootstrap, [bench.topic])
            rate = await produce_traces(bootstrap, bench.topic, 0, args.traces)
            report["prefill_traces_per_s"] = round(rate, 1)
        results: dict[str, Any] = report["scenarios"]

        async def scenario(name: str, coro: Any) -> None:
            print(f"{name} ...", flush=True)
            results[name] = await coro
            print(f"  {results[name]}", flush=True)

        if "limit" in wanted or "judge-calls" in wanted:  # judge-calls gives its CPU against the limit's
            await scenario("limit", scenarios.limit(bench))
        if "plain_peer" in wanted:
            await scenario("plain_peer", scenarios.plain_peer(bench))
        if "peer" in wanted:
            await scenario("peer", scenarios.peer(bench))
        if "deterministic" in wanted:
            await scenario("deterministic", scenarios.deterministic(bench))
        if "reviewed" in wanted:
            await scenario("reviewed", scenarios.reviewed(bench))
        if "reviewed_all" in wanted:
            await scenario("reviewed_all", scenarios.reviewed_all(bench))
        if "scale_out" in wanted:
            await scenario(f"deterministic_x{args.scale_workers}", scenarios.scale_out(bench, args.scale_workers))
        if "judge" in wanted:
            for concurrency in (int(c) for c in args.judge_concurrency.split(",")):
                at = "" if args.judge_latency == scenarios.JUDGE_LATENCY_S else f"_at_{args.judge_latency:g}s"
                await scenario(f"judge_{concurrency}{at}",
                               scenarios.judge_bound(bench, concurrency, args.judge_seconds, args.judge_latency))
        if "latency" in wanted:
            det = results.get("deterministic", {}).get("traces_per_s")
            rate = args.latency_rate or (det / 2 if det else 200.0)
            await scenario("latency", scenarios.latency(bench, rate, args.latency_seconds))
        if "backlog" in wanted:
            await scenario("backlog", scenarios.backlog(bench, args.backlog))
        if "spend" in wanted:
            await scenario("spend", scenarios.spend(bench, args.spend_traces))
        if "filtered" in wanted:
            for variant in filtered.VARIANTS:
                await scenario(f"filtered_{variant.name}", filtered.filtered(bench, variant))
        if "backfill" in wanted:
            print(f"pre-filling {args.backfill_traces:,} past traces for the backfill", flush=True)
            topic, window = await backfill.past_traces(bench, "backfill-traces", args.backfill_traces)
            await scenario("backfill_live", backfill.live(bench, topic, args.backfill_traces))
            await scenario("backfill", backfill.backfill(bench, topic, window, args.backfill_traces))
            det = results.get("deterministic", {}).get("traces_per_s") or results["backfill_live"].get("traces_per_s")
            rate = args.latency_rate or (det / 2 if det else 200.0)
            size = args.backfill_backlog or backfill.backlog_for(results["backfill"].get("traces_per_s"),
                                                                 args.latency_seconds, args.backfill_traces)
            await scenario("backfill_latency", backfill.latency(bench, rate, args.latency_seconds, size))
        if "judge-calls" in wanted:
            await scenario("judge_calls", judge_calls.judge_calls(bench, args.judge_calls_traces,
                                                                  results.get("limit", {}).get("cpu_s_per_1k")))
        if "verdict-cache" in wanted:
            await scenario("verdict_cache", verdict_cache.verdict_cache(bench, args.cache_traces))
        if "tenants" in wanted:
            await scenario("tenants", tenants.tenants(bench, [int(s) for s in args.tenant_sizes.split(",")],
                                                      [int(w) for w in args.tenant_workers.split(",")],
                                                      args.tenant_idle_seconds, args.tenant_traces))
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    _ratios(report)
    return report


def _ratios(report: dict[str, Any]) -> None:
    results = report["scenarios"]
    limit = results.get("limit", {}).get("traces_per_s")
    limit_cpu = results.get("limit", {}).get("cpu_s_per_1k")
    for name, r in results.items():
        if limit and "traces_per_s" in r and not name.startswith("judge"):
            r["ratio_to_limit"] = round(r["traces_per_s"] / limit, 3)
        if limit_cpu and r.get("cpu_s_per_1k"):  # CPU per trace (per judge call) over the limit's
            r["cpu_vs_limit"] = round(r["cpu_s_per_1k"] / limit_cpu, 2)
    det, peer, plain = results.get("deterministic", {}), results.get("peer", {}), results.get("plain_peer", {})
    report["deterministic_vs_limit"] = det.get("ratio_to_limit")
    report["deterministic_cpu_vs_limit"] = det.get("cpu_vs_limit")
    if det.get("traces_per_s") and peer.get("traces_per_s"):
        report["deterministic_vs_peer"] = round(det["traces_per_s"] / peer["traces_per_s"], 3)
    if det.get("traces_per_s") and plain.get("traces_per_s"):
        report["deterministic_vs_plain_peer"] = round(det["traces_per_s"] / plain["traces_per_s"], 3)
    bf, bf_live = results.get("backfill", {}), results.get("backfill_live", {})
    if bf_live.get("traces_per_s"):
        for figure, ratio in (("traces_per_s", "vs_live"), ("job_traces_per_s", "job_vs_live")):
            if bf.get(figure):
                bf[ratio] = round(bf[figure] / bf_live["traces_per_s"], 3)
        if bf.get("cpu_s_per_1k") and bf_live.get("cpu_s_per_1k"):
            bf["cpu_vs_live"] = round(bf["cpu_s_per_1k"] / bf_live["cpu_s_per_1k"], 2)
        report["backfill_vs_live"] = bf.get("vs_live")


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:,.3f}".rstrip("0").rstrip(".") if isinstance(value, float) else str(value)


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [f"# Benchmark ({report['started_at']})", "",
             f"Machine: {m['cores']} cores, {m['memory_gb']} GB, {m['cpu_model']}; load average at start "
             f"{m['load_average_at_start']}, at end {report.get('load_average_at_end')}.", "",
             f"**deterministic / limit: {_cell(report['deterministic_vs_limit'])}** in traces/s, "
             f"**{_cell(report.get('deterministic_cpu_vs_limit'))}x** the limit's CPU per trace; deterministic / "
             f"plain peer: {_cell(report.get('deterministic_vs_plain_peer'))}, / Quix peer: "
             f"{_cell(report.get('deterministic_vs_peer'))}", "",
             *([f"**backfill / live: {_cell(report['backfill_vs_live'])}** in traces/s (the same traces and groups)",
                ""] if report.get("backfill_vs_live") is not None else []),
             "| scenario | traces/s | ratio to limit | CPU s / 1k traces | CPU x limit | peak RSS MB | Redis cmds / pair "
             "| notes |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, r in report["scenarios"].items():
        notes = ""
        if name == "judge_calls":
            s, w = r["redis"], r["write"]
            notes = (f"{r['traces']:,} traces, one judge call each; CPU is per call. Keeping records: index "
                     f"{_cell(s['index_bytes_per_call'])} B a call, {_cell(w['without']['index_bytes_per_result'])} "
                     f"without calls: the calls add {_cell(r['redis_bytes_per_kept_call'])} B "
                     f"({_cell(r['redis_bytes_per_kept_call_real_answer'])} with a ~300-char answer; record "
                     f"{_cell(s['record_bytes_mean'])} B encoded), list {_cell(s['list_bytes_per_result'])} B a result; "
                     f"in-process {_cell(r['keep_us']['total'])} us a call (kept {_cell(r['keep_us']['kept'])}, encode "
                     f"{_cell(r['keep_us']['encode'])}), write +{_cell(w['diff']['client_cpu_us'])} us client CPU, "
                     f"+{_cell(w['diff']['wall_us'])} us wall, +{_cell(w['diff']['server_cpu_us'])} us Redis CPU, "
                     f"+{_cell(w['diff']['redis_cmds'])} Redis commands an entry (the index entry itself: "
                     f"+{_cell(w['index_diff']['server_cpu_us'])} us Redis CPU, +{_cell(w['index_diff']['redis_cmds'])} "
                     f"commands); {_cell(r['keep_cpu_us_per_call'])} us = **{_cell(r['keep_vs_worker_call'])}** of the "
                     f"worker's CPU a call, **{_cell(r['keep_vs_limit_trace'])}x** the limit's a trace")
        elif name == "tenants":
            notes = tenants.notes(r)
        elif name.startswith("judge"):
            notes = (f"{_cell(r.get('calls_per_s'))} calls/s of {_cell(r.get('ideal_calls_per_s'))} ideal "
                     f"({_cell(r.get('ratio_to_ideal'))}); the judge server alone answers "
                     f"{_cell(r.get('server_capacity_calls_per_s'))}/s to a minimal client; worker "
                     f"{_cell(r.get('cpu_cores_used'))} cores busy, {_cell(r.get('cpu_starved'))} starved")
        elif name == "spend":
            every, first = r["every_member"], r["gates_first"]
            notes = (f"judge calls per trace: {every['judge_calls_per_trace']} every member, "
                     f"{first['judge_calls_per_trace']} gatesFirst ({_cell(r['judge_calls_saved'])} saved, "
                     f"{r['failing_gate']:.0%} of traces fail the free gate); CPU s / 1k traces "
                     f"{every['cpu_s_per_1k']} / {first['cpu_s_per_1k']}")
        elif name == "latency":
            notes = (f"at {_cell(r.get('achieved_rate'))} traces/s: p50 {r.get('p50_ms')} ms, p99 {r.get('p99_ms')} ms,"
                     f" max {r.get('max_ms')} ms; worker {_cell(r.get('cpu_starved'))} starved")
        elif name == "backfill" and "traces" in r:
            notes = (f"{r['traces']:,} traces in {r.get('seconds')} s by ratings, {_cell(r.get('job_seconds'))} s job "
                     f"start to done ({_cell(r.get('job_traces_per_s'))}/s); / live: {_cell(r.get('vs_live'))} "
                     f"by ratings, {_cell(r.get('job_vs_live'))} by job; CPU x live {_cell(r.get('cpu_vs_live'))}; "
                     f"{_cell(r.get('cpu_cores_used'))} cores busy; per group: " + ", ".join(
                         f"{g} {_cell(v['traces_per_s'])}/s ({','.join(v['origins'])})"
                         for g, v in r.get("groups", {}).items()))
        elif name == "backfill_latency":
            p = r.get("progress") or {}
            notes = (f"at {_cell(r.get('achieved_rate'))} traces/s: p99 {r.get('p99_ms_alone')} ms alone, "
                     f"{r.get('p99_ms_with_job')} ms with a job (p50 {r.get('p50_ms_alone')} / {r.get('p50_ms_with_job')},"
                     f" max {r.get('max_ms_alone')} / {r.get('max_ms_with_job')}); jobs over {r.get('backlog'):,} past "
                     f"traces at {_cell(p.get('at_start', {}).get('fraction'))} -> "
                     f"{_cell(p.get('at_end', {}).get('fraction'))} through the window, "
                     f"{_cell(r.get('backfill_traces_per_s_during'))} traces/s meanwhile")
        elif "traces" in r:
            notes = (f"{r['workers']} workers; " if r.get("workers") else "") + (
                     f"{r['traces']:,} traces in {r.get('seconds')} s; {_cell(r.get('cpu_cores_used'))} cores busy, "
                     f"{_cell(r.get('cpu_starved'))} starved; "
                     f"with children {_cell(r.get('tree_peak_rss_mb'))} MB")
        elif "skipped" in r:
            notes = f"skipped: {r['skipped']}"
        lines.append(f"| {name} | {_cell(r.get('traces_per_s'))} | {_cell(r.get('ratio_to_limit'))} | "
                     f"{_cell(r.get('cpu_s_per_1k'))} | {_cell(r.get('cpu_vs_limit'))} | {_cell(r.get('peak_rss_mb'))} | "
                     f"{_cell(r.get('redis_cmds_per_pair'))} | {notes} |")
    if "tenants" in report["scenarios"]:
        lines += ["", *tenants.table(report["scenarios"]["tenants"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", type=int, default=100_000, help="traces pre-filled in the topic")
    parser.add_argument("--backlog", type=int, default=None,
                        help="traces waiting in the backlog scenario (default 10 x --traces, 1,000,000)")
    parser.add_argument("--quick", action="store_true",
                        help="a few minutes: 10,000 traces, a 30,000 backlog, 8 s judge windows, 10 s of latency")
    parser.add_argument("--judge-seconds", type=float, default=20.0, help="measured window per concurrency")
    parser.add_argument("--judge-concurrency", default="16,64,256", help="SGW_JUDGE_CONCURRENCY values to run")
    parser.add_argument("--judge-latency", type=float, default=0.3,
                        help="seconds the judge server takes to answer (real LLM judges: 1-10)")
    parser.add_argument("--latency-seconds", type=float, default=30.0)
    parser.add_argument("--latency-rate", type=float, default=None, help="default: half the deterministic rate")
    parser.add_argument("--sandboxes", type=int, default=2, help="SGW_CODE_SANDBOXES of the worker")
    parser.add_argument("--scale-workers", type=int, default=2, help="worker processes in the scale_out scenario")
    parser.add_argument("--worker-setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a worker setting for every scenario, e.g. max_in_flight=1024 (SGW_MAX_IN_FLIGHT)")
    parser.add_argument("--spend-traces", type=int, default=3000, help="traces of the spend scenario")
    parser.add_argument("--backfill-traces", type=int, default=None,
                        help="traces of the backfill scenario's rate (default --traces, at most 20,000)")
    parser.add_argument("--backfill-backlog", type=int, default=None,
                        help="past traces behind the live loop in backfill_latency (default: twice what the "
                             "backfill grades in the latency window)")
    parser.add_argument("--cache-traces", type=int, default=3000,
                        help="traces each of the verdict-cache scenario's three drains grades")
    parser.add_argument("--judge-calls-traces", type=int, default=2000,
                        help="traces of the judge-calls scenario's worker (past the 1,000 results a group keeps)")
    parser.add_argument("--tenant-sizes", default="1000,10000,50000", help="catalog sizes (groups) of tenants")
    parser.add_argument("--tenant-workers", default="1,2,4", help="fleet sizes (worker processes) of tenants")
    parser.add_argument("--tenant-idle-seconds", type=float, default=30.0, help="tenants' idle window per fleet")
    parser.add_argument("--tenant-traces", type=int, default=10_000,
                        help="traces of the bench project tenants drains per catalog (and in a 10-group one)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(ALL)}")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="py-spy profiles of each measured window, and their steps, written to DIR")
    args = parser.parse_args()
    if args.quick:
        args.traces = min(args.traces, 10_000)
        args.judge_seconds, args.latency_seconds = min(args.judge_seconds, 8.0), min(args.latency_seconds, 10.0)
        args.backlog = args.backlog or 3 * args.traces
    args.backlog = args.backlog or 10 * args.traces
    args.backfill_traces = args.backfill_traces or min(args.traces, 20_000)
    report = asyncio.run(run(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench-results.json").write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    table = markdown(report)
    (args.out / "bench-results.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
