"""A tenant against the backfills (security review), on the real API process, broker and
Redis; each failed before its fix:

- 25 starts at once make no more jobs than a project's cap (3), the rest a 409 naming it: the
  cap is checked and a place taken in one script (``adapters.stores.backfills``);
- a project's one job is not queued behind another project's three: projects take turns, then
  their jobs (``consumers.backfill.turn_order``);
- a job's ``tracesRead`` counts its own project's traces only: another project's traffic in the
  same window is not the tenant's to know.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

import consumers.backfill as backfill_module
from adapters.stores.backfills import MAX_ACTIVE_JOBS, BackfillStore
from consumers.backfill import BackfillRunner
from scoring.catalog import CatalogSnapshot
from tests.support import backfill_bench
from tests.support.api_process import ApiProcess, api_with_key
from tests.support.backfill_bench import APOLOGY, BY_PATTERN, DAY, SORRY, Bench, group_doc, trace
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

bench, judge_server = backfill_bench.bench, backfill_bench.judge_server  # the fixtures, for this module

STARTS = 25


@pytest.fixture(scope="module")
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str]]:
    with api_with_key(redis_databases, tmp_path_factory.mktemp("api"), "p-racer") as (process, key):
        yield process, key


async def test_concurrent_starts_make_no_more_jobs_than_the_cap(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    with process.client(key) as client:
        judge = client.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()
        group = client.post("/v1/scorer-groups", json={
            "name": "G", "members": [{"kind": "judge", "refId": judge["id"]}],
            "online": {"enabled": False, "sampleRate": 0.3, "alertThreshold": 6, "severity": "high"}}).json()
    now = datetime.now(UTC)
    window = {"from": (now - timedelta(hours=3)).isoformat(), "to": (now - timedelta(minutes=1)).isoformat()}

    async with httpx.AsyncClient(base_url=process.url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=60) as client:
        answers = await asyncio.gather(*(client.post(f"/v1/scorer-groups/{group['id']}/backfills", json=window)
                                         for _ in range(STARTS)))
        listed = (await client.get(f"/v1/scorer-groups/{group['id']}/backfills")).json()

    started = [a for a in answers if a.status_code == 202]
    refused = [a for a in answers if a.status_code != 202]
    assert len(started) == MAX_ACTIVE_JOBS, [a.status_code for a in answers]
    assert len(listed) == MAX_ACTIVE_JOBS and {j["id"] for j in listed} == {a.json()["id"] for a in started}
    assert {a.status_code for a in refused} == {409}
    assert all(f"at most {MAX_ACTIVE_JOBS}" in a.json()["detail"] for a in refused), refused[0].text


async def test_a_projects_one_job_takes_turns_with_another_projects_three(
        bench: Bench, monkeypatch: pytest.MonkeyPatch) -> None:
    # A turn of one fetch of 50 records: every job takes several turns to read the topic.
    monkeypatch.setattr(backfill_module, "READ_TURN_S", 0.0)
    monkeypatch.setattr(backfill_module, "BATCH", 50)
    turns: list[str] = []
    turn = BackfillRunner._turn

    async def counted(self: BackfillRunner, job_id: str, stop: asyncio.Event) -> None:
        turns.append(job_id)
        await turn(self, job_id, stop)

    monkeypatch.setattr(BackfillRunner, "_turn", counted)
    a, b = f"p-a-{bench.unique}", f"p-b-{bench.unique}"
    await bench.produce([_at_minute(a if n % 2 else b, n) for n in range(300)])
    a_group, b_group = group_doc(f"ga-{bench.unique}", a, BY_PATTERN), group_doc(f"gb-{bench.unique}", b, BY_PATTERN)
    snapshot = CatalogSnapshot(groups={a_group.id: a_group, b_group.id: b_group}, patterns={"apology": APOLOGY})
    a_jobs = [await bench.job(a_group, rate=0.0) for _ in range(MAX_ACTIVE_JOBS)]  # A's cap, all queued
    b_job = await bench.job(b_group, rate=0.0)

    b_done = await bench.run(bench.runner(lambda: snapshot), b_job, timeout_s=180)
    a_then = [await BackfillStore(bench.redis).get(job_id) for job_id in a_jobs]

    # Other tests' jobs left in this Redis may take turns too (a third project): only these count.
    ours = [job_id for job_id in turns if job_id in {*a_jobs, b_job}]
    b_turns = [job_id == b_job for job_id in ours[:2 * MAX_ACTIVE_JOBS]]
    assert b_turns in ([False, True] * MAX_ACTIVE_JOBS, [True, False] * MAX_ACTIVE_JOBS), \
        f"B has every other turn while A's {MAX_ACTIVE_JOBS} jobs wait: {ours}"
    assert b_done.status == "done" and b_done.progress.traces_read == 150
    assert all(job.status != "done" for job in a_then), \
        f"B's job was done while each of A's was still reading: {[j.progress.fraction for j in a_then]}"


async def test_traces_read_counts_only_the_jobs_own_projects_traces(bench: Bench) -> None:
    other = f"p-other-{bench.unique}"
    mine = [trace(bench.project, n, SORRY) for n in range(10)]
    theirs = [{**trace(other, n, "done"), "traceId": f"theirs-{n}"} for n in range(7)]  # the same window
    await bench.produce([*mine, *theirs])
    group = group_doc(f"g-{bench.unique}", bench.project, BY_PATTERN)
    snapshot = CatalogSnapshot(groups={group.id: group}, patterns={"apology": APOLOGY})

    job = await bench.run(bench.runner(lambda: snapshot), await bench.job(group))

    assert job.status == "done" and job.progress.fraction == 1.0
    assert (job.progress.traces_read, job.progress.pairs_scored) == (len(mine), len(mine)), \
        f"another project's {len(theirs)} traces are not counted: {job.progress}"


def _at_minute(project: str, n: int) -> dict[str, Any]:
    return {**trace(project, 0, "fine"), "traceId": f"t-{n}", "timestamp": (DAY + timedelta(minutes=n)).isoformat()}
