"""The catalog and read-back commands, as an operator types them, on the real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters.stores.ratings import RatingsStore, SessionVerdict
from scoring.results import HistoryEntry
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "catalog.example.yaml"


@pytest.fixture
def url(redis_db_url: str) -> str:
    return redis_db_url


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SGW_REDIS_URL": url, "SGW_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "worker.cli", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_applying_the_example_twice_reports_no_change_the_second_time(url: str) -> None:
    first = cli(url, "catalog", "apply", str(EXAMPLE))
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines()[-1] == "15 created, 0 changed, 0 unchanged"
    second = cli(url, "catalog", "apply", str(EXAMPLE))
    assert second.returncode == 0
    assert second.stdout.strip().splitlines()[-1] == "0 created, 0 changed, 15 unchanged"


def test_a_bad_file_is_refused_whole_listing_every_error(url: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"groups": [{"id": "g", "name": "G", "projectId": "p", "members": [
        {"kind": "judge", "refId": "nope", "weight": 1, "gate": False}],
        "online": {"enabled": True, "sampleRate": 2, "alertThreshold": 6, "severity": "high"}}]}))
    done = cli(url, "catalog", "apply", str(bad))
    assert done.returncode == 2
    assert "error (400):" in done.stderr and "groups[0] 'g': online.sampleRate" in done.stderr
    assert "groups[0] 'g': members[0].refId: no LLM judge with id 'nope'" in done.stderr, \
        "the refused group's refs are checked too"
    listing = cli(url, "catalog", "list")
    assert (listing.returncode, listing.stderr) == (0, ""), listing.stderr
    assert listing.stdout == "", "nothing half-applied"


def test_list_get_delete(url: str) -> None:
    cli(url, "catalog", "apply", str(EXAMPLE))
    listing = cli(url, "catalog", "list", "groups").stdout
    assert "support-quality  Support quality bar" in listing
    shown = json.loads(cli(url, "catalog", "get", "channels", "support-bot|https://hooks.example.com/support-alerts").stdout)
    assert shown["secret"] == "**********", "secrets are masked when shown"
    assert cli(url, "catalog", "delete", "judges", "tone").returncode == 0
    missing = cli(url, "catalog", "get", "judges", "tone")
    assert missing.returncode == 1 and "404" in missing.stderr


async def test_ratings_table_and_json_and_session_scores(url: str) -> None:
    cli(url, "catalog", "apply", str(EXAMPLE))
    redis = connect(url)
    now = time.time()
    await RatingsStore(redis).write(
        [HistoryEntry("support-quality", 8.0, False, now), HistoryEntry("support-quality", 4.0, True, now),
         HistoryEntry("support-quality", None, False, now)],
        [SessionVerdict("s-1", "support-conversations", 4.5, "Weighted blend: 4.50/10. Tone 0.45", now)])
    await redis.aclose()
    table = cli(url, "groups", "ratings", "support-quality", "--window", "24h")
    assert table.returncode == 0, table.stderr
    assert "3 results, 2 scored, mean 6.00, 1 below threshold, 1 without a score" in table.stdout
    as_json = json.loads(cli(url, "groups", "ratings", "support-quality", "--json").stdout)
    assert (as_json["window"], as_json["count"], as_json["mean"]) == ("7d", 3, 6.0)
    scores = json.loads(cli(url, "sessions", "scores", "s-1").stdout)
    assert scores[0]["kind"] == "scorer-group:support-conversations" and scores[0]["rating"] == 4.5
    unknown = cli(url, "groups", "ratings", "nope")
    assert unknown.returncode == 2 and "404" in unknown.stderr
