"""Running the real worker as a subprocess against the real broker and Redis, and reading what
it publishes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from services.groups import MonitorClient
from tests.support.redis_clients import connect

ROOT = Path(__file__).resolve().parents[2]


# Every worker a test starts, until it ends: see ``end_leftover_workers``.
_started: list[WorkerProcess] = []


def end_leftover_workers() -> list[str]:
    """Kill the workers the test started and did not stop - it failed first, or stopping one of
    several failed - so that none outlives its test, still reading and writing what later tests
    use. Returns their names."""
    left = [w for w in _started if w.proc is not None and w.proc.poll() is None]
    for worker in left:
        assert worker.proc is not None
        worker.proc.kill()
        worker.proc.wait()
    _started.clear()
    return [w.name for w in left]


@dataclass
class WorkerProcess:
    env: dict[str, str]
    name: str = "worker"
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0  # 0: the worker binds a free port itself and logs it (no race for it)
    log_path: Path | None = None
    prefix: tuple[str, ...] = ()  # a command the worker runs under (``unshare --user ...``)

    def start(self, log_dir: Path) -> WorkerProcess:
        self.log_path = log_dir / f"{self.name}.log"
        env = {**os.environ, **self.env, "SGW_METRICS_PORT": str(self.metrics_port),
               "SGW_LOG_FORMAT": "json", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sdk'}"}
        self.proc = subprocess.Popen([*self.prefix, sys.executable, "-m", "worker.cli", "run"], env=env, cwd=ROOT,
                                     stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT)
        _started.append(self)
        return self

    @property
    def url(self) -> str:
        if not self.metrics_port:
            self.metrics_port = self._logged_port()
        return f"http://127.0.0.1:{self.metrics_port}"

    def _logged_port(self, timeout_s: float = 60) -> int:
        """The port the worker bound for its ops endpoint, read from its log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.logs(whole=True).splitlines():
                if '"ops endpoint listening"' in line:
                    return int(orjson.loads(line)["port"])
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.logs()}")
            time.sleep(0.1)
        raise AssertionError(f"{self.name} logged no ops port in {timeout_s}s:\n{self.logs()}")

    def wait_ready(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not ready in {timeout_s}s:\n{self.logs()}")

    def metrics(self) -> str:
        return httpx.get(self.url + "/metrics", timeout=5).text

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a metric's samples whose labels include ``labels``."""
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            if all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self, timeout_s: float = 90) -> int:  # past the worker's watchdog: a hang shows its record
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"{self.name} did not stop on SIGTERM:\n{self.logs()}") from None
        return self.proc.returncode

    def logs(self, whole: bool = False) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""
        return text if whole else text[-6000:]


async def produce(bootstrap: str, topic: str, records: Sequence[tuple[bytes | None, bytes]],
                  headers: Sequence[list[tuple[str, bytes]] | None] = ()) -> None:
    """Publish (key, value) records, the i-th with ``headers[i]`` if given."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        acks = [await producer.send(topic, key=k, value=v, headers=headers[i] if i < len(headers) else None)
                for i, (k, v) in enumerate(records)]
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


async def read_topic(bootstrap: str, topic: str, until: Callable[[list[Any]], bool],
                     timeout_s: float = 90, settle_s: float = 0.0,
                     keep: Callable[[Any], Any] = lambda record: orjson.loads(record.value)) -> list[Any]:
    """Read ``topic`` from the start until ``until(values)`` holds (then ``settle_s`` more, to
    catch anything extra), or the timeout; values are decoded JSON (or what ``keep`` makes of
    each record)."""
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                enable_auto_commit=False, group_id=None)
    await consumer.start()
    values: list[Any] = []
    try:
        deadline = time.monotonic() + timeout_s
        settled_at: float | None = None
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            for records in batches.values():
                values.extend(keep(r) for r in records)
            if settled_at is None and until(values):
                settled_at = time.monotonic() + settle_s
            if settled_at is not None and time.monotonic() >= settled_at:
                break
    finally:
        await consumer.stop()
    return values


def redis_db(redis_url: str, db: int) -> str:
    """The same server, another database (the benchmarks keep their runs apart by it)."""
    return redis_url.rsplit("/", 1)[0] + f"/{db}"


def worker_env(kafka_bootstrap: str, redis_url: str, tag: str, **settings: object) -> dict[str, str]:
    """A worker's environment with topics and consumer group of its own (named by ``tag``);
    ``settings`` are further SGW_* values by field name (``judge_base_url=...``)."""
    env = {"SGW_KAFKA_BOOTSTRAP": kafka_bootstrap, "SGW_REDIS_URL": redis_url,
           "SGW_CONSUMER_GROUP": f"workers-{tag}", "SGW_TRACES_TOPIC": f"traces-{tag}",
           "SGW_RATINGS_TOPIC": f"ratings-{tag}", "SGW_SIGNALS_TOPIC": f"signals-{tag}",
           "SGW_WEBHOOKS_TOPIC": f"webhooks-{tag}", "SGW_WEBHOOKS_DLQ_TOPIC": f"webhooks-dlq-{tag}",
           "SGW_DLQ_TOPIC": f"dlq-{tag}", "SGW_LABELS_TOPIC": f"labels-{tag}"}
    env.update({f"SGW_{name.upper()}": str(value) for name, value in settings.items()})
    return env


@contextlib.asynccontextmanager
async def catalog_db(url: str, catalog: dict[str, Any]) -> AsyncIterator[str]:
    """``catalog`` applied to the database at ``url`` - the test's own (``redis_db_url``), which is
    emptied before and after the test; yields the URL."""
    redis = connect(url)
    try:
        await MonitorClient(redis).apply(catalog)
    finally:
        await redis.aclose()
    yield url
