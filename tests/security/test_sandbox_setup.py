"""The sandbox's start-up fails closed everywhere: whatever stops it from being set up, code
scorers report why and score nothing, and the worker goes on scoring every other member kind."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from adapters.members import sandbox as sandbox_module
from adapters.members.sandbox import SandboxPool
from scoring.ports import CodeScorerError
from tests.support.harness import WorkerProcess, catalog_db, produce, read_topic, worker_env

ONLINE = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}
CATALOG: dict[str, Any] = {
    "patterns": [{"id": "polite", "name": "Polite", "polarity": "failure", "contains": ["stupid"]}],
    "customs": [{"id": "length", "name": "Length", "type": "code",
                 "code": "def score(i, o, e, s, m):\n    return min(1.0, len(o) / 10)\n"}],
    "groups": [{"id": "mixed", "name": "Mixed", "projectId": "p-setup", "online": ONLINE,
                "members": [{"kind": "custom", "refId": "length", "weight": 1, "gate": False},
                            {"kind": "pattern", "refId": "polite", "weight": 1, "gate": False}]}],
}


async def test_any_setup_error_leaves_the_pool_unavailable_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: object) -> None:
        raise RuntimeError("cgroup could not be made")
    monkeypatch.setattr(sandbox_module, "prepare", broken)
    sandbox = SandboxPool(1)
    await sandbox.start()  # does not raise
    try:
        assert not sandbox.available
        assert sandbox.unavailable_reason == "setting up the sandbox failed: RuntimeError: cgroup could not be made"
        with pytest.raises(CodeScorerError) as caught:
            await sandbox.run("p", "k", "def score(*a):\n    return 1\n", {}, 1.0)
        assert str(caught.value).startswith("sandbox unavailable: setting up the sandbox failed")
        assert sandbox.live_processes == 0
    finally:
        await sandbox.close()


def user_namespaces_as_root() -> None:
    try:
        done = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"unshare cannot run here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"this machine refuses user namespaces: {done.stderr.decode().strip()}")


async def test_a_worker_that_cannot_take_the_sandbox_identity_still_scores_the_rest(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    # Root inside a user namespace that maps only itself: it may not switch to SGW_SANDBOX_UID.
    user_namespaces_as_root()
    async with catalog_db(redis_db_url, CATALOG) as url:
        env = worker_env(kafka_bootstrap, url, f"setup-{unique}")
        worker = WorkerProcess(env, prefix=("unshare", "--user", "--map-root-user")).start(tmp_path)
        try:
            worker.wait_ready()
            async with httpx.AsyncClient() as client:
                ready = await client.get(worker.url + "/readyz", timeout=5)
            assert ready.status_code == 200, ready.text
            assert "code scorers unavailable: this process may not start a process as uid 65534" in ready.text
            assert worker.metric("sgw_code_sandbox_available") == 0.0
            trace = {"traceId": "t-1", "projectId": "p-setup", "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
                     "spans": [{"spanId": "r", "input": "q", "output": "a fine answer"}]}
            await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"], [(b"t-1", orjson.dumps(trace))])
            ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= 1)
            assert worker.proc is not None and worker.proc.poll() is None, worker.logs()
        finally:
            code = worker.stop()
        assert code == 0, worker.logs()
    members = {m["name"]: m for m in ratings[0]["members"]}
    assert members["Length"]["status"] == "failed"
    assert members["Length"]["detail"].startswith("sandbox unavailable: this process may not start a process as uid")
    assert members["Polite"]["status"] == "scored"
