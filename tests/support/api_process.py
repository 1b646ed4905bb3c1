"""The real API process (``scorer-worker api``) on a loopback port against the real Redis, and
API keys made with the real CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from devtools.judge_server import JudgeServer
from devtools.processes import free_port

if TYPE_CHECKING:
    from tests.support.redis_databases import RedisDatabases

ROOT = Path(__file__).resolve().parents[2]


def cli(redis_url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGW_REDIS_URL": redis_url, "SGW_LOG_FORMAT": "console",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sdk'}", **(env or {})}
    return subprocess.run([sys.executable, "-m", "worker.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def create_key(redis_url: str, *args: str) -> str:
    """A new key (``--project P`` or ``--operator``): the last line of the CLI's stdout."""
    done = cli(redis_url, "keys", "create", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


# Every API process a test starts: none may outlive the session (``end_leftover_apis``).
_started: list[ApiProcess] = []


def end_leftover_apis() -> list[str]:
    """Kill the API processes still running (a fixture or test that never stopped its own);
    their logs' paths."""
    left = [p for p in _started if p.proc is not None and p.proc.poll() is None]
    for process in left:
        process.stop()
    _started.clear()
    return [str(p.log_path) for p in left]


@dataclass
class ApiProcess:
    redis_url: str
    log_path: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)  # more SGW_* settings (a judge endpoint, ...)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90) -> ApiProcess:
        """Started, and answering ``/healthz``; one that is not within ``timeout_s`` (a busy
        machine's start-up is slow: a generous deadline) is stopped before the error is raised."""
        env = {**os.environ, "SGW_REDIS_URL": self.redis_url, "SGW_API_PORT": str(self.port),
               "SGW_API_HOST": "127.0.0.1", "SGW_LOG_FORMAT": "json", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sdk'}", **self.env}
        self.proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "api"], env=env, cwd=ROOT,
                                     stdout=open(self.log_path, "wb"), stderr=subprocess.STDOUT)
        _started.append(self)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"api exited with {self.proc.returncode}:\n{self.logs()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()  # never left running after the test that started it
        raise AssertionError(f"api not up in {timeout_s}s:\n{self.logs()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace")[-6000:]

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=10)


@contextmanager
def api_with_key(redis_databases: RedisDatabases, log_dir: Path, project: str,
                 env: dict[str, str] | None = None) -> Iterator[tuple[ApiProcess, str]]:
    """The API process on a Redis database of its own, and a key of ``project``; stopped after."""
    with redis_databases.lease() as url:
        key = create_key(url, "--project", project)
        process = ApiProcess(url, log_dir / "api.log", env=env or {}).start()
        try:
            yield process, key
        finally:
            process.stop()


@contextmanager
def api_with_judge(redis_databases: RedisDatabases, log_dir: Path, project: str,
                   env: dict[str, str] | None = None) -> Iterator[tuple[ApiProcess, str, JudgeServer]]:
    """The API process grading with a local judge of its own, on a Redis database of its own,
    and a key of ``project``; stopped after."""
    with JudgeServer() as judge, redis_databases.lease() as url:
        key = create_key(url, "--project", project)
        process = ApiProcess(url, log_dir / "api.log", env={"SGW_JUDGE_BASE_URL": judge.base_url, **(env or {})})
        process.start()
        try:
            yield process, key, judge
        finally:
            process.stop()
