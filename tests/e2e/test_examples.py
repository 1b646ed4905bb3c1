"""The spec's walkthroughs (examples/eval_deep_dive/) run end to end, as ``./dev example 09``
and ``./dev example 10`` run them: the real worker, API, broker and Redis, a local judge, and
the example as a separate process that knows only the API and the ingest topic."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.harness import ROOT

pytestmark = pytest.mark.integration


def run_example(example: str, kafka_bootstrap: str, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGW_KAFKA_BOOTSTRAP": kafka_bootstrap, "SGW_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "devtools.examples", example], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=280)


def test_09_groups_dataset_gates_and_live_signals(kafka_bootstrap: str, redis_db_url: str) -> None:
    done = run_example("09", kafka_bootstrap, redis_db_url)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "(group): 8.50 (3 of 3 rows scored)" in out and "Safety: 9.00" in out
    assert "gate on the group score: passed at 8.50 >= 7" in out
    assert "gate on Safety at 9.5: gate failed: judge 'Safety' average is 9.00, under 9.5 by 0.50" in out
    assert "3 results, 3 scored, mean 5.17, 1 below the threshold" in out  # (9 + 0 + 6.5) / 3
    assert 'high: 0.00 < 6.0 on trace-' in out and 'must-pass member "PII" failed' in out


def test_10_a_conversation_is_judged_once_quiet(kafka_bootstrap: str, redis_db_url: str) -> None:
    done = run_example("10", kafka_bootstrap, redis_db_url)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "sent 3 turns of session-" in out
    assert "8.0 - Weighted blend: 8.00/10, must-pass Apology passed." in out
