"""Runs one of the walkthroughs in ``examples/eval_deep_dive/`` against the local stack:
``./dev example 09`` (or ``10``).

Needs SGW_KAFKA_BOOTSTRAP and SGW_REDIS_URL (``python -m devtools.services run -- ...`` sets
them). It starts, on loopback, the local judge server (devtools/judge_server.py: it rates by the
``[[rating@model=N]]`` markers the examples' answers carry), ``scorer-worker api`` with an API
key for the project ``demo``, and ``scorer-worker run`` on topics of this run; then runs the
example as a user would (a separate Python process that knows only the API's URL and key, and
where to send traces), prints what it prints, and stops everything. Exits with the example's
exit code.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from devtools.judge_server import JudgeServer
from devtools.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"09": ROOT / "examples" / "eval_deep_dive" / "09_scorer_groups.py",
            "10": ROOT / "examples" / "eval_deep_dive" / "10_session_group_scoring.py"}
PROJECT = "demo"


def _wait_for(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} not ready in {timeout_s:.0f}s")


def run(example: str, *, quiet_services: bool = True) -> int:
    tag = uuid.uuid4().hex[:8]
    topics = {name: f"example-{example}-{name}-{tag}" for name in
              ("traces", "ratings", "signals", "webhooks", "webhooks-dlq", "dlq")}
    api_port, ops_port = free_port(), free_port()
    with JudgeServer(default_rating=7) as judge:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SGW_JUDGE_BASE_URL": judge.base_url,
               "SGW_CONSUMER_GROUP": f"example-{tag}", "SGW_TRACES_TOPIC": topics["traces"],
               "SGW_RATINGS_TOPIC": topics["ratings"], "SGW_SIGNALS_TOPIC": topics["signals"],
               "SGW_WEBHOOKS_TOPIC": topics["webhooks"], "SGW_WEBHOOKS_DLQ_TOPIC": topics["webhooks-dlq"],
               "SGW_DLQ_TOPIC": topics["dlq"], "SGW_SESSION_SWEEP_INTERVAL_S": "0.5",
               "SGW_API_HOST": "127.0.0.1", "SGW_API_PORT": str(api_port), "SGW_METRICS_PORT": str(ops_port),
               "SGW_LOG_LEVEL": "warning"}
        key = subprocess.run([sys.executable, "-m", "worker.cli", "keys", "create", "--project", PROJECT,
                              "--name", f"example {example}"], env=env, cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
        out = subprocess.DEVNULL if quiet_services else None
        api = subprocess.Popen([sys.executable, "-m", "worker.cli", "api"], env=env, cwd=ROOT, stdout=out, stderr=out)
        worker = subprocess.Popen([sys.executable, "-m", "worker.cli", "run"], env=env, cwd=ROOT,
                                  stdout=out, stderr=out)
        try:
            _wait_for(f"http://127.0.0.1:{api_port}/healthz", api, "the API")
            _wait_for(f"http://127.0.0.1:{ops_port}/readyz", worker, "the worker")
            user_env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(ROOT),
                        "SCORER_GROUPS_URL": f"http://127.0.0.1:{api_port}", "SCORER_GROUPS_API_KEY": key,
                        "KAFKA_BOOTSTRAP": env["SGW_KAFKA_BOOTSTRAP"], "TRACES_TOPIC": topics["traces"],
                        "SIGNALS_TOPIC": topics["signals"], "PROJECT_ID": PROJECT}
            return subprocess.run([sys.executable, str(EXAMPLES[example])], env=user_env, cwd=ROOT,
                                  timeout=300).returncode
        finally:
            for proc in (worker, api):
                proc.terminate()
            for proc in (worker, api):
                try:
                    proc.wait(timeout=45)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("example", choices=sorted(EXAMPLES))
    parser.add_argument("--show-services", action="store_true", help="print the worker's and the API's logs too")
    args = parser.parse_args(argv)
    return run(args.example, quiet_services=not args.show_services)


if __name__ == "__main__":
    sys.exit(main())
