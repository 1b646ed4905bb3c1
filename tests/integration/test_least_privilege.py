"""A worker whose Kafka principal may not create topics (``SGW_CREATE_TOPICS=false``): it checks
that its topics exist, and starts on topics made beforehand; when some are missing it says which
in one line and exits 2 - no traceback, and nothing created. The real broker, the real CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from devtools.processes import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("traces", "ratings", "signals", "webhooks", "webhooks_dlq", "dlq")


def _env(kafka: str, redis_url: str, run: str, metrics_port: int) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SGW_")},
            "SGW_KAFKA_BOOTSTRAP": kafka, "SGW_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT),
            "SGW_CREATE_TOPICS": "false", "SGW_CONSUMER_GROUP": f"lp-{run}", "SGW_METRICS_PORT": str(metrics_port),
            "SGW_LOG_FORMAT": "json", **{f"SGW_{n.upper()}_TOPIC": f"lp-{run}.{n}" for n in NAMES}}


async def _topics(kafka: str, create: list[str] | None = None) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka)
    await admin.start()
    try:
        if create:
            await admin.create_topics([NewTopic(t, num_partitions=1, replication_factor=1) for t in create])
        return set(await admin.list_topics())
    finally:
        await admin.close()


def test_missing_topics_are_named_and_nothing_is_created(kafka_bootstrap: str, redis_db_url: str) -> None:
    run = uuid.uuid4().hex[:8]
    asyncio.run(_topics(kafka_bootstrap, [f"lp-{run}.traces", f"lp-{run}.ratings"]))  # four still missing
    done = subprocess.run([sys.executable, "-m", "worker.cli", "run"], cwd=ROOT, capture_output=True, text=True,
                          timeout=90, env=_env(kafka_bootstrap, redis_db_url, run, free_port()))
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "SGW_CREATE_TOPICS=false" in errors[0], done.stderr[-3000:]
    for name in ("signals", "webhooks", "webhooks_dlq", "dlq"):
        assert f"lp-{run}.{name}" in errors[0]
    assert f"lp-{run}.traces" not in errors[0] and "Traceback" not in done.stderr
    assert not {f"lp-{run}.{n}" for n in ("signals", "dlq")} & asyncio.run(_topics(kafka_bootstrap)), "none created"


def test_the_worker_starts_on_topics_made_beforehand(kafka_bootstrap: str, redis_db_url: str) -> None:
    run = uuid.uuid4().hex[:8]
    asyncio.run(_topics(kafka_bootstrap, [f"lp-{run}.{n}" for n in NAMES]))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "run"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=_env(kafka_bootstrap, redis_db_url, run, port))
    try:
        deadline, ready = time.monotonic() + 60, False
        while time.monotonic() < deadline and proc.poll() is None and not ready:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert ready, proc.stderr.read().decode()[-3000:] if proc.poll() is not None else "not ready in 60 s"
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
