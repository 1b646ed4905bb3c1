"""An alignment run outlives the API process that grades it, on the real Redis and API processes:
the process is killed (SIGKILL) mid-run, another one takes the run over once the dead one's lease
runs out, grades only what has no verdict yet, and the run ends ``done`` with every case graded by
both judges - the calls repeated are at most the chunk that was in flight, and every call made
took a slot of the project's judge budget."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import orjson
import pytest

from adapters.stores import keys
from adapters.stores.alignments import AlignmentStore
from adapters.stores.claims import Claims
from devtools.judge_server import Behaviour, JudgeServer
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases
from worker.alignment_runner import CHUNK

pytestmark = pytest.mark.integration

PROJECT = "p-resume"
ROWS = 160
JUDGE_DELAY_S = 0.25  # a run of ~280 calls takes several seconds: long enough to be cut


def rows() -> list[dict[str, object]]:
    return [{"input": f"question {n}", "humanRating": n % 11,
             "output": f"answer {n} [[rating={(n + 2) % 11}]] [[key=case-{n}]]"} for n in range(ROWS)]


async def test_a_run_whose_process_is_killed_is_resumed_by_another_and_ends_done(
        redis_databases: RedisDatabases, tmp_path: Path) -> None:
    with JudgeServer() as judge, redis_databases.lease() as url:
        judge.set_default(Behaviour.deterministic(delay=JUDGE_DELAY_S))
        key, operator = create_key(url, "--project", PROJECT), create_key(url, "--operator")
        env = {"SGW_JUDGE_BASE_URL": judge.base_url}
        first = ApiProcess(url, tmp_path / "first.log", env=env).start()
        second = ApiProcess(url, tmp_path / "second.log", env=env)
        try:
            with first.client(operator) as http:
                assert http.put(f"/v1/budgets/{PROJECT}", json={
                    "judgeCallsPerWindow": 100_000, "windowSeconds": 86_400}).status_code == 200
            with first.client(key) as http:
                judge_id = http.post("/v1/judges", json={"name": "Helpful", "criteria": "Helpful?"}).json()["id"]
                content = "\n".join(orjson.dumps(r).decode() for r in rows())
                dataset = http.post("/v1/datasets", json={"name": "Labelled", "content": content}).json()["id"]
                started = http.post(f"/v1/judges/{judge_id}/alignments",
                                    json={"candidate": {"criteria": "Helpful and kind?"}, "dataset": dataset})
                assert started.status_code == 202, started.text
                location, total = started.headers["Location"], started.json()["total"]

                # 1. Killed once it has graded some of the run, not all.
                deadline = time.monotonic() + 60
                while (done := http.get(location).json()["done"]) < CHUNK and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert CHUNK <= done < total, (done, total)
            assert first.proc is not None
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait()
            calls_at_kill = sum(judge.calls_by_key.values())

            # 2. Another process resumes it, once the dead one's lease ran out.
            second.start()
            with second.client(key) as http:
                deadline = time.monotonic() + keys.ALIGNMENT_LEASE_MS / 1000 + 90
                while (run := http.get(location).json())["state"] in ("running", "interrupted"):
                    assert time.monotonic() < deadline, run
                    await asyncio.sleep(0.2)
        finally:
            first.stop()
            second.stop()
        made = sum(judge.calls_by_key.values())
        per_case = dict(judge.calls_by_key)

        redis = connect(url)
        try:
            paid = await Claims(redis).budget_used(PROJECT, 86_400)
            left = await AlignmentStore(redis).active()
            work_left = await redis.exists(keys.alignment_work(judge_id, run["id"]),
                                           keys.alignment_verdicts(judge_id, run["id"]))
        finally:
            await redis.aclose()

    assert run["state"] == "done", run
    assert run["done"] == total and run["counts"]["budgetSkipped"] == 0, run
    assert run["current"]["cases"] == run["candidateFigures"]["cases"] == total // 2, run
    assert 0 < calls_at_kill < total, "the kill came mid-run"
    # Each case is asked once per judge, but for the chunk in flight at the kill.
    repeated = sum(max(0, calls - 2) for calls in per_case.values())
    assert made - total == repeated <= CHUNK, (made, total, repeated)
    assert made <= paid <= total + CHUNK, (made, paid)  # every call took a slot; a chunk's reserved twice at most
    assert left == {} and work_left == 0, "the job ended with its run"
