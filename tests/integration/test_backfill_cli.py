"""``scorer-worker backfill``, as an operator types it, on the real Redis: refusals are
the API's, one ``error: <field>: <why>`` line each and exit 2 without a traceback; a queued job
prints its id, is listed and cancelled; ``--follow`` ends with the job (1: cancelled). No worker
runs here, so a job stays queued until it is cancelled."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.support.api_process import ROOT, cli

pytestmark = pytest.mark.integration
EXAMPLE = ROOT / "deploy" / "catalog.example.yaml"  # support-quality: trace scope; support-conversations: session
JOB_LINE = re.compile(r"^backfill (bf-[0-9a-f]{16}) queued: group support-quality, \S+ to \S+, sample rate 1$")


@pytest.fixture
def url(redis_db_url: str) -> str:
    applied = cli(redis_db_url, "catalog", "apply", str(EXAMPLE))
    assert applied.returncode == 0, applied.stderr
    return redis_db_url


def backfill(url: str, *args: str, project: str = "shop-support") -> subprocess.CompletedProcess[str]:
    done = cli(url, "backfill", "--project", project, *args)
    said = done.stdout + done.stderr
    assert "Traceback" not in said and "whsec_" not in said, said  # never a stack, never a secret
    return done


def test_a_session_scope_group_is_refused_in_one_line_naming_scope(url: str) -> None:
    refused = backfill(url, "--group", "support-conversations", "--since", "24h")
    assert refused.returncode == 2 and refused.stdout == ""
    assert len(refused.stderr.splitlines()) == 1 and refused.stderr.startswith(
        "error: scope: a session-scope group cannot be backfilled"), refused.stderr


@pytest.mark.parametrize(("group", "args", "lines"), [
    ("support-quality", ["--since", "yesterday", "--until", "2026-01-01T00:00:00"],
     ["error: --since: 'yesterday' is neither a duration (90m, 24h, 7d) nor an ISO time",
      "error: --until: 2026-01-01T00:00:00 has no time zone: give one (Z, +02:00) or a duration back from now"]),
    ("support-quality", ["--since", "1h", "--until", "2h"], ["error: to: must be after from"]),
    ("support-quality", ["--since", "1h", "--until", "2999-01-01T00:00:00Z"],
     ["error: to: must not be in the future (a backfill grades traffic that already passed)"]),
    ("support-quality", ["--since", "1h", "--max-judge-calls", "0", "--sample-rate", "2"],
     ["error: sampleRate: Input should be less than or equal to 1", "error: maxJudgeCalls: Input should be greater"]),
    # Another project's group (advisor-compliance is wealth-advisor's), whether started or listed.
    ("advisor-compliance", ["--since", "1h"], ["error: no scorer group with id 'advisor-compliance'"]),
    ("advisor-compliance", ["--list"], ["error: no scorer group with id 'advisor-compliance'"]),
    ("support-quality", [], ["error: --since: required"]),
])
def test_each_refusal_is_a_line_naming_its_field(url: str, group: str, args: list[str], lines: list[str]) -> None:
    refused = backfill(url, "--group", group, *args)
    assert refused.returncode == 2 and refused.stdout == ""
    said = refused.stderr.splitlines()
    assert len(said) == len(lines) and all(s.startswith(line) for s, line in zip(said, lines, strict=True)), said


def test_a_queued_job_prints_its_id_and_is_listed_and_cancelled(url: str) -> None:
    started = backfill(url, "--group", "support-quality", "--since", "24h")
    assert started.returncode == 0, started.stderr
    match = JOB_LINE.match(started.stdout.strip())
    assert match, started.stdout
    job_id = match[1]
    listed = backfill(url, "--list", "--group", "support-quality")
    assert listed.stdout.splitlines()[0].startswith(f"backfill {job_id} queued: "), listed.stdout
    assert backfill(url, "--cancel", job_id, project="wealth-advisor").returncode == 2, "another project's job"
    cancelled = backfill(url, "--cancel", job_id)
    assert (cancelled.returncode, cancelled.stdout) == (0, f"backfill {job_id} cancelled\n")
    again = backfill(url, "--cancel", job_id)
    assert (again.returncode, again.stderr) == (2, f"error: backfill {job_id!r} has already ended (cancelled)\n")


def test_follow_ends_with_the_job(url: str) -> None:
    env = {**os.environ, "SGW_REDIS_URL": url, "SGW_LOG_FORMAT": "console",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sdk'}"}
    follow = subprocess.Popen([sys.executable, "-m", "worker.cli", "backfill", "--project", "shop-support", "--group",
                               "support-quality", "--since", "2h", "--follow"], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follow.stdout is not None
        match = JOB_LINE.match(follow.stdout.readline().strip())
        assert match, "the job's line comes first, before the wait"
        assert follow.poll() is None, "still following a queued job"
        assert backfill(url, "--cancel", match[1]).returncode == 0
        out, err = follow.communicate(timeout=30)
    finally:
        if follow.poll() is None:
            follow.kill()
    assert follow.returncode == 1, err
    assert out == f"backfill {match[1]} cancelled: 0 traces read, 0 pairs scored, 0 skipped, 0 judge calls\n"
    assert err == "", "no bar on a pipe"
