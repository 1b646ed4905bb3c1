"""A backfill through the API and the worker: traces produced over a
past day, a group created with live scoring off, a job over that day started through the API;
the worker grades every trace once as "backfill" and the job reaches done with fraction 1.0."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from tests.support.api_process import ApiProcess, create_key
from tests.support.harness import WorkerProcess, catalog_db, read_topic, worker_env

pytestmark = pytest.mark.integration

DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)
TRACES = 12


async def test_a_job_started_through_the_api_grades_the_past_day(
        kafka_bootstrap: str, redis_db_url: str, unique: str, tmp_path: Path) -> None:
    project = "p-bf"
    async with catalog_db(redis_db_url, {"patterns": [{"id": "apology", "name": "Apology", "polarity": "failure",
                                                       "template": "apology", "projectId": project}]}) as url:
        env = worker_env(kafka_bootstrap, url, unique, commit_interval_s=0.2)
        worker = WorkerProcess(env).start(tmp_path)
        api = ApiProcess(url, tmp_path / "api.log").start()
        try:
            worker.wait_ready()
            producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
            await producer.start()
            try:
                for n in range(TRACES):
                    at = DAY + timedelta(hours=n)
                    trace = {"traceId": f"t-{n}", "projectId": project, "agentId": "a", "timestamp": at.isoformat(),
                             "spans": [{"spanId": "r", "input": "q", "output": "done"}]}
                    await producer.send_and_wait(env["SGW_TRACES_TOPIC"], orjson.dumps(trace), key=f"t-{n}".encode(),
                                                 timestamp_ms=int(at.timestamp() * 1000))
            finally:
                await producer.stop()
            with api.client(create_key(url, "--project", project)) as client:
                group = client.post("/v1/scorer-groups", json={
                    "name": "Later", "members": [{"kind": "pattern", "refId": "apology", "weight": 1}]}).json()
                started = client.post(f"/v1/scorer-groups/{group['id']}/backfills", json={
                    "from": DAY.isoformat(), "to": (DAY + timedelta(days=1)).isoformat(), "sampleRate": 1})
                assert started.status_code == 202, started.text
                job = started.json()
                deadline = time.monotonic() + 60
                while job["status"] != "done" and time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    job = client.get(f"/v1/backfills/{job['id']}").json()
            ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= TRACES,
                                       settle_s=1)
        finally:
            api.stop()
            assert worker.stop() == 0, worker.logs()
    assert job["status"] == "done" and job["progress"]["fraction"] == 1.0, job
    assert job["progress"]["tracesRead"] == TRACES and job["progress"]["pairsScored"] == TRACES
    assert sorted(r["traceId"] for r in ratings) == sorted(f"t-{n}" for n in range(TRACES))
    assert {r["origin"] for r in ratings} == {"backfill"}, "graded again, and says so"
