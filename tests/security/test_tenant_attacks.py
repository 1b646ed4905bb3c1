"""A hostile tenant against the real worker (``scorer-worker run`` on the real broker and Redis)
and the real grading CLI: every attack on the worker, at once, beside a victim tenant.

The worker holds secrets (a judge API key, a variable named like a password, the victim's
channel secret in Redis). Afterwards: no secret in any output topic, log line or CLI output;
the worker alive, exiting 0 on SIGTERM; every victim trace and session rated with its own value;
/healthz answering within a second while the worst accepted pattern reads a 1 MB trace.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiokafka import AIOKafkaConsumer

from tests.support.harness import ROOT, WorkerProcess, catalog_db, produce, read_topic, worker_env
from tests.support.http_fakes import ScriptedServer

pytestmark = pytest.mark.integration

JUDGE_KEY = "sk-judge-CANARY-7f3a9c1e5b"
DB_PASSWORD = "db-CANARY-pass-42d1"
VICTIM_CHANNEL_SECRET = "whsec_Q0FOQVJZLXZpY3RpbS1jaGFubmVsLXNlY3JldA=="
CANARIES = (JUDGE_KEY, DB_PASSWORD, VICTIM_CHANNEL_SECRET, "CANARY")

# Tries the escape that worked before (rebinding the runner's audit hook), then reads every
# environment and command line it can see and any file a secret could sit in. It reports what it
# found through its score and, if anything, through its error text.
ESCAPE = '''
import os, sys
def score(input, output, expected, spans, metadata):
    try:
        sys.modules["__main__"]._audit.__code__ = (lambda e, a: None).__code__
    except Exception:
        pass
    seen = [repr(dict(os.environ))]
    for pid in os.listdir("/proc"):
        for name in ("environ", "cmdline"):
            try:
                seen.append(open(f"/proc/{pid}/{name}", "rb").read().decode("latin-1"))
            except Exception:
                pass
    for path in ("/work", "/root", "/etc", "/home", "/tmp"):
        try:
            seen.append(repr(os.listdir(path)))
        except Exception:
            pass
    hits = [s for s in seen if "CANARY" in s or "SGW_" in s or "whsec_" in s]
    if hits:
        raise RuntimeError(" ".join(hits)[::-1])  # reversed, so shape-based scrubbing cannot help
    return 0.0
'''
KILLER = '''
import os, signal
def score(input, output, expected, spans, metadata):
    for attempt in (lambda: signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 9),
                    lambda: os.kill(os.getppid(), 9), lambda: os.kill(1, 9), lambda: os.killpg(0, 9)):
        try:
            attempt()
        except Exception:
            pass
    return 0.5
'''
HIJACK = '''
import sys
def score(input, output, expected, spans, metadata):
    sys.modules["__main__"]._call = lambda *a: 1.0
    return 0.0
'''
HOG = "def score(input, output, expected, spans, metadata):\n    while True:\n        pass\n"
VICTIM = "def score(input, output, expected, spans, metadata):\n    return 0.25\n"
WORST_ACCEPTED_REGEX = r"(\w+\s?){1,150}zz"  # 1,655 RE2 instructions: just under the cap

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}
SESSION = {**ONLINE, "scope": "session", "idleSeconds": 1}


def member(kind: str, ref: str, weight: float = 1, gate: bool = False) -> dict[str, Any]:
    return {"kind": kind, "refId": ref, "weight": weight, "gate": gate}


def catalog(channel_url: str, eavesdropper_url: str = "http://127.0.0.1:9/eavesdrop") -> dict[str, Any]:
    return {
        "patterns": [{"id": "worst", "name": "Worst regex", "polarity": "failure", "regex": WORST_ACCEPTED_REGEX},
                     {"id": "clean", "name": "Clean", "polarity": "failure", "contains": ["forbidden"]}],
        "customs": [{"id": "escape", "name": "Escape", "type": "code", "code": ESCAPE},
                    {"id": "killer", "name": "Killer", "type": "code", "code": KILLER},
                    {"id": "hijack", "name": "Hijack", "type": "code", "code": HIJACK},
                    {"id": "hog", "name": "Hog", "type": "code", "code": HOG, "timeoutMs": 1500},
                    {"id": "victim", "name": "Victim", "type": "code", "code": VICTIM}],
        "groups": [
            {"id": "evil", "name": "Evil", "projectId": "p-evil", "online": ONLINE,
             "members": [member("custom", "escape"), member("custom", "killer"), member("custom", "hog"),
                         member("pattern", "worst")]},
            # A second hostile project: it patches the runner so every later call answers 1.0.
            {"id": "hijack", "name": "Hijack", "projectId": "p-hijack", "online": ONLINE,
             "members": [member("custom", "hijack")]},
            {"id": "evil-sessions", "name": "Evil sessions", "projectId": "p-evil", "online": SESSION,
             "members": [member("pattern", "worst")]},
            {"id": "good", "name": "Good", "projectId": "p-good", "online": {**ONLINE, "alertThreshold": 7},
             "members": [member("custom", "victim"), member("pattern", "clean")]},
            {"id": "good-sessions", "name": "Good sessions", "projectId": "p-good", "online": SESSION,
             "members": [member("pattern", "clean")]},
        ],
        "channels": [{"agentId": "agent-good", "projectId": "p-good", "url": channel_url,
                      "secret": VICTIM_CHANNEL_SECRET},
                     # The attacker registers a channel under the victim's agent id, hoping for its Signals.
                     {"agentId": "agent-good", "projectId": "p-evil", "url": eavesdropper_url}],
    }


def trace(trace_id: str, project: str, output: Any, session: str | None = None) -> bytes:
    return orjson.dumps({
        "traceId": trace_id, "projectId": project, "agentId": f"agent-{project[2:]}", "sessionId": session,
        "timestamp": "2026-12-02T13:00:00Z",
        "spans": [{"spanId": "r", "parentSpanId": None, "name": "agent.run", "input": "hi", "output": output}]})


def nested(record: bytes, depth: int) -> bytes:
    """The record with its output replaced by lists nested ``depth`` deep (no encoder makes those)."""
    return record.replace(b'"POISON"', b"[" * depth + b"]" * depth)


async def topic_bytes(bootstrap: str, topic: str) -> bytes:
    """Everything on a topic, keys and values, raw: where a leaked secret would be."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    chunks: list[bytes] = []
    try:
        for _ in range(10):
            batches = await consumer.getmany(timeout_ms=500)
            if not batches and chunks:
                break
            for records in batches.values():
                chunks += [(r.key or b"") + b"\n" + (r.value or b"") for r in records]
    finally:
        await consumer.stop()
    return b"\n".join(chunks)


class HealthProbe:
    """Asks /healthz every 100 ms from a thread; remembers the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url, self.slowest, self.failures = url, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                httpx.get(self.url + "/healthz", timeout=5).raise_for_status()
            except httpx.HTTPError:
                self.failures += 1
            self.slowest = max(self.slowest, time.monotonic() - started)
            self._stop.wait(0.1)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def test_a_hostile_tenant_reads_nothing_and_stops_nothing(kafka_bootstrap: str, redis_db_url: str,
                                                               unique: str, tmp_path: Path) -> None:
    with ScriptedServer() as receiver, ScriptedServer() as eavesdropper:
        # The victim's channel URL carries credentials: the sender uses them, no topic shows them.
        with_credentials = receiver.url.replace("http://", "http://hook-user:CANARY-pw@") + "/hook?token=CANARY-tok"
        async with catalog_db(redis_db_url, catalog(with_credentials, eavesdropper.url + "/steal")) as url:
            env = worker_env(kafka_bootstrap, url, f"sec-{unique}", judge_api_key=JUDGE_KEY,
                             egress_allow="127.0.0.0/8", max_trace_bytes=2 * 1024 * 1024,
                             session_sweep_interval_s=0.5, member_deadline_s=20, claim_lease_s=60)
            env["APP_DATABASE_PASSWORD"] = DB_PASSWORD
            worker = WorkerProcess(env).start(tmp_path)
            try:
                worker.wait_ready()
                good = [f"good-{i}" for i in range(12)]
                records = []
                for i, trace_id in enumerate(good):
                    records.append((trace_id.encode(), trace(trace_id, "p-good", f"fine answer {i}", f"gs-{i % 2}")))
                    if i % 4 == 0:
                        records.append((b"evil", trace(f"evil-{i}", "p-evil", "attack", f"es-{i}")))
                        records.append((b"hijack", trace(f"hijack-{i}", "p-hijack", "attack")))
                # Poison: nested past every later step's limit, for a trace and for a session turn.
                records.append((b"poison", nested(trace("poison", "p-evil", "POISON"), 300)))
                records.append((b"poison-s", nested(trace("poison-s", "p-evil", "POISON", "es-0"), 200)))
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], records)

                await read_topic(
                    kafka_bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=120,
                    until=lambda v: ({r.get("traceId") for r in v} >= set(good)
                                     and sum(r["groupId"] == "good-sessions" for r in v) >= 2
                                     and sum(r["groupId"] == "evil" for r in v) >= 3))

                # The 1 MB trace against the worst accepted pattern: the loop keeps answering.
                with HealthProbe(worker.url) as probe:
                    big = "ab " * (1_000_000 // 3)  # a megabyte (decimal): what the producer may send
                    await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                                  [(b"big", trace("evil-big", "p-evil", big)),
                                   (b"after-big", trace("good-after-big", "p-good", "fine"))])
                    more = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], timeout_s=120,
                                            until=lambda v: {"evil-big", "good-after-big"} <= {r.get("traceId") for r in v})
                assert probe.failures == 0 and probe.slowest < 1.0, (probe.failures, probe.slowest)

                assert worker.proc is not None and worker.proc.poll() is None, worker.logs()
                assert worker.metric("sgw_code_sandbox_available") == 1.0
                # /readyz and the startup log say which bounds hold each call.
                ready = await asyncio.to_thread(httpx.get, worker.url + "/readyz", timeout=5)
                assert "per call: one process (no fork, no threads), a hard CPU limit" in ready.text, ready.text
                assert "per call: one process (no fork, no threads)" in worker.logs(whole=True)
            finally:
                code = worker.stop()
            assert code == 0, worker.logs()

            # The victim's every trace and conversation is rated once, with its own value.
            by_trace = Counter(r["traceId"] for r in more if r["groupId"] == "good")
            assert all(by_trace[t] == 1 for t in [*good, "good-after-big"]), by_trace
            assert {r["rating"] for r in more if r["groupId"] == "good"} == {6.25}  # (0.25 + 1) / 2
            assert {r["rating"] for r in more if r["groupId"] == "good-sessions"} == {10.0}

            # Each attack failed where it was aimed.
            evil = [r for r in more if r["groupId"] == "evil" and r["traceId"] != "evil-big"]
            assert evil
            for rating in evil:
                members = {m["name"]: m for m in rating["members"]}
                assert members["Escape"]["status"] == "scored" and members["Escape"]["native"] == 0.0, members
                assert members["Killer"]["native"] == 0.5  # it ran; its signals reached nothing
                assert members["Hog"]["status"] == "failed" and "timed out" in members["Hog"]["detail"]
            big_rating = next(r for r in more if r["traceId"] == "evil-big")
            assert {m["name"]: m["status"] for m in big_rating["members"]}["Worst regex"] == "scored"

            dead = await read_topic(kafka_bootstrap, env["SGW_DLQ_TOPIC"], until=lambda v: len(v) >= 2)
            assert Counter(d["reason"] for d in dead) == {"too_deep": 2}

            # No secret anywhere the worker writes.
            for topic in ("SGW_RATINGS_TOPIC", "SGW_SIGNALS_TOPIC", "SGW_WEBHOOKS_TOPIC", "SGW_DLQ_TOPIC"):
                written = await topic_bytes(kafka_bootstrap, env[topic])
                assert not [c for c in CANARIES if c.encode() in written], topic
            log = worker.log_path.read_text(errors="replace") if worker.log_path else ""
            assert not [c for c in CANARIES if c in log]
            assert not [c for c in CANARIES if any(c in r.body.decode(errors="replace") for r in receiver.requests)]
            # The victim's Signals (6.25 < 7) reached the victim's channel, never the attacker's.
            assert receiver.requests and not eavesdropper.requests
            assert all(r.path == "/hook?token=CANARY-tok" and r.headers.get("authorization") for r in receiver.requests)


def test_grading_a_run_with_hostile_scorers_leaks_nothing(redis_db_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "SGW_REDIS_URL": redis_db_url, "SGW_JUDGE_API_KEY": JUDGE_KEY, "APP_DATABASE_PASSWORD": DB_PASSWORD,
           "PYTHONPATH": str(ROOT)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "worker.cli", *args], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=120)

    (tmp_path / "catalog.json").write_text(json.dumps(catalog("http://127.0.0.1:9/hook")))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("\n".join(json.dumps({"input": "hi", "output": f"answer {i}"}) for i in range(3)) + "\n")
    applied = cli("catalog", "apply", str(tmp_path / "catalog.json"))
    assert applied.returncode == 0, applied.stderr
    graded = cli("grade", "--group", "evil", "--input", str(rows))
    shown = cli("catalog", "get", "channels", "agent-good")
    settings = cli("settings")
    assert graded.returncode == 0, graded.stderr
    lines = [json.loads(line) for line in graded.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 3
    for line in lines:
        members = {row["name"]: row for row in line["scorerRows"]}
        assert members["Escape"]["status"] == "scored" and members["Escape"]["native"] == 0.0, line
        assert members["Killer"]["native"] == 0.5
    for output in (graded, shown, settings):
        assert not [c for c in CANARIES if c in output.stdout or c in output.stderr], output.args

