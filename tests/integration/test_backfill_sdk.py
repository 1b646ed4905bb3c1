"""Backfill jobs from the SDK, against the real API process and Redis: a job started
with a duration, read back, listed and cancelled; ``wait()`` returns once the job has ended -
cancelled from elsewhere, as no worker runs here (a job stays queued without one) - and gives
up after its timeout; refusals name their field. Both clients, the sync one from a thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from scorer_groups import AsyncClient, BadRequest, Client, Conflict, NotFound, ScorerGroup
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

ONLINE = {"enabled": False, "sampleRate": 0.3, "alertThreshold": 6, "severity": "high"}


class Env:
    def __init__(self, process: ApiProcess, keys: dict[str, str]) -> None:
        self.process, self.keys = process, keys

    def client(self, who: str = "a") -> Client:
        return Client(self.process.url, self.keys[who])

    def group(self, online: dict[str, object] | None = ONLINE) -> ScorerGroup:
        with self.client() as client:
            judge = client.monitor.judges.create(name="Q", criteria="Helpful?")
            return client.monitor.scorer_groups.create("Past traffic", members=[
                {"kind": "judge", "ref_id": judge.id, "weight": 1}], online=online)


@pytest.fixture(scope="module")
def seeded_api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with redis_databases.lease() as url:
        keys = {"a": create_key(url, "--project", "p-a"), "b": create_key(url, "--project", "p-b")}
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield Env(process, keys)
        finally:
            process.stop()


def test_a_job_is_started_read_listed_waited_on_and_cancelled(seeded_api: Env, capsys: pytest.CaptureFixture[str]) -> None:
    group = seeded_api.group()
    with seeded_api.client() as client, seeded_api.client("b") as other:
        before = datetime.now(UTC)
        job = client.monitor.scorer_groups.backfill(group.id, since="24h")
        assert (job.status, job.group_id, job.project_id, job.sample_rate) == ("queued", group.id, "p-a", 0.3)
        assert job.to - job.from_ == timedelta(hours=24), "since and the default until read against one now"
        assert before <= job.to <= datetime.now(UTC), "until: now"

        read = client.monitor.backfills.get(job.id)
        assert (read.id, read.status, read.from_, read.to) == (job.id, "queued", job.from_, job.to)
        assert [j.id for j in client.monitor.scorer_groups.backfills(group.id)] == [job.id]
        with pytest.raises(NotFound):
            other.monitor.backfills.get(job.id)  # another project's job does not exist

        def cancel() -> None:
            with seeded_api.client() as elsewhere:
                elsewhere.monitor.backfills.cancel(job.id)

        # No worker runs: the job stays queued until it is cancelled, here from another thread.
        canceller = threading.Timer(0.5, cancel)
        canceller.start()
        started = time.monotonic()
        ended = job.wait(progress=True, poll_s=0.1, timeout_s=30)
        canceller.join()
        assert ended.status == "cancelled" and job.status == "cancelled", "returned, not raised; the handle too"
        assert time.monotonic() - started < 10
        drawn = capsys.readouterr().err
        assert "\r[" in drawn and "0 traces read  0 pairs scored  queued" in drawn and drawn.endswith("cancelled\n")
        with pytest.raises(Conflict):
            job.cancel()  # an ended job cannot be cancelled


def test_wait_gives_up_after_its_timeout_and_the_job_goes_on(seeded_api: Env) -> None:
    group = seeded_api.group()
    with seeded_api.client() as client:
        job = client.monitor.scorer_groups.backfill(group.id, since=datetime.now(UTC) - timedelta(hours=2),
                                                    until="1h", sample_rate=1, max_judge_calls=100, alerts=True)
        assert (job.sample_rate, job.max_judge_calls, job.alerts) == (1.0, 100, True)
        with pytest.raises(TimeoutError, match=f"backfill {job.id} is still queued"):
            job.wait(poll_s=0.05, timeout_s=0.3)
        assert client.monitor.backfills.get(job.id).status == "queued"
        assert client.monitor.backfills.cancel(job.id).status == "cancelled"


async def test_the_async_client_waits_while_another_task_cancels(seeded_api: Env) -> None:
    group = seeded_api.group()
    async with AsyncClient(seeded_api.process.url, seeded_api.keys["a"]) as client:
        job = await client.monitor.scorer_groups.backfill(group.id, since="90m", until="30m")
        assert job.to - job.from_ == timedelta(hours=1)

        async def cancel_soon() -> None:
            await asyncio.sleep(0.3)
            await client.monitor.backfills.cancel(job.id)

        ended, _ = await asyncio.wait_for(asyncio.gather(job.wait(poll_s=0.05), cancel_soon()), timeout=30)
        assert ended.status == "cancelled"
        assert [j.status for j in await client.monitor.scorer_groups.backfills(group.id)] == ["cancelled"]


def test_refusals_name_their_field(seeded_api: Env) -> None:
    sessions = seeded_api.group({**ONLINE, "scope": "session"})
    bare = seeded_api.group(None)
    with seeded_api.client() as client:
        with pytest.raises(BadRequest) as refused:
            client.monitor.scorer_groups.backfill(sessions.id, since="1h")
        assert refused.value.fields == ["scope"], refused.value.problem
        with pytest.raises(BadRequest) as refused:
            client.monitor.scorer_groups.backfill(bare.id, since="1h")
        assert refused.value.fields == ["sampleRate"], "no online profile to take the sample from"
        with pytest.raises(BadRequest) as refused:
            client.monitor.scorer_groups.backfill(bare.id, since="1h", until="2h", sample_rate=1)
        assert refused.value.fields == ["to"], "a window that ends before it starts"
        with pytest.raises(ValueError, match="has no time zone"):
            client.monitor.scorer_groups.backfill(bare.id, since=datetime(2026, 1, 1), sample_rate=1)
        assert client.monitor.scorer_groups.backfills(bare.id) == [], "nothing was queued"
