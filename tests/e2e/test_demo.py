"""``./dev demo`` is the product tour: on the real broker and Redis, the demo prints where to
look once the first ratings are in (the console, a key, an SDK snippet that runs as printed, the
dashboard), its traffic dips and recovers (Signals) and runs out of budget for a moment
(skipped), and a healthy start prints no error line and no traceback."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.api_process import ApiProcess
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration  # ~90 s of a worker, the API and traffic, beside other tests

ROOT = Path(__file__).resolve().parents[2]
SECONDS = 80  # one cycle: the dip at 20-40 s, no budget at 55-70 s


@dataclass
class Demo:
    output: str
    redis_url: str


@pytest.fixture(scope="module")
def ran(kafka_bootstrap: str, redis_databases: RedisDatabases) -> Iterator[Demo]:
    with redis_databases.lease() as redis_url:
        run = uuid.uuid4().hex[:8]
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("SGW_")},
               "SGW_KAFKA_BOOTSTRAP": kafka_bootstrap, "SGW_REDIS_URL": redis_url, "PYTHONPATH": str(ROOT),
               "SGW_CONSUMER_GROUP": f"demo-{run}", "SGW_TOPIC_PARTITIONS": "2",
               **{f"SGW_{name.upper()}_TOPIC": f"demo-{run}.{name}"
                  for name in ("traces", "ratings", "signals", "webhooks", "webhooks_dlq", "dlq")}}
        done = subprocess.run([sys.executable, "-m", "devtools.demo", "--seconds", str(SECONDS)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=SECONDS + 120)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output[-4000:]
        yield Demo(output, redis_url)


@pytest.fixture(scope="module")
def demo(ran: Demo) -> str:
    return ran.output


def test_a_healthy_start_shows_no_error_and_no_traceback(demo: str) -> None:
    bad = [line for line in demo.splitlines() if "Error" in line or "Traceback" in line]
    assert not bad, "\n".join(bad[:20])


def test_the_tour_says_where_to_look_and_its_sdk_snippet_runs_as_printed(ran: Demo, tmp_path: Path) -> None:
    demo = ran.output
    assert "The first ratings are in" in demo
    console = re.search(r"console\s+(http://127\.0\.0\.1:\d+)/console", demo)
    key = re.search(r"key\s+(sgw_\S+)\s+\(project shop-support\)", demo)
    assert console and key, demo[-3000:]
    assert "deploy/grafana/scorer-group-worker.json" in demo and (ROOT / "deploy/grafana/scorer-group-worker.json").is_file()
    # What a newcomer pastes: the lines from the heredoc's first to its EOF, flush left.
    lines = demo.split("\n")
    first = lines.index(".venv/bin/python - <<'EOF'")
    snippet = "\n".join(lines[first:lines.index("EOF", first) + 1]) + "\n"
    assert f'Client("{console.group(1)}", "{key.group(1)}")' in snippet
    # The demo's API stopped with it: the snippet runs as printed, in a shell from the project's
    # root, against another API on the same store.
    api = ApiProcess(ran.redis_url, tmp_path / "api.log").start()
    try:
        done = subprocess.run(["bash", "-c", snippet.replace(console.group(1), api.url)],
                              capture_output=True, text=True, timeout=60, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "sdk")})
    finally:
        api.stop()
    assert done.returncode == 0, done.stderr
    quality = re.search(r"Support quality bar: (\d+) scored, mean \S+, (\d+) below the bar, (\d+) skipped", done.stdout)
    assert quality, done.stdout
    scored, below, skipped = (int(n) for n in quality.groups())
    assert scored > 20 and below > 0 and skipped > 0, done.stdout


def test_the_traffic_dips_raises_signals_recovers_and_runs_out_of_budget(demo: str) -> None:
    lines = demo.splitlines()
    dip = next(n for n, line in enumerate(lines) if line.startswith("TRAFFIC") and "dip" in line)
    recovered = next(n for n, line in enumerate(lines) if line.startswith("TRAFFIC") and "recovers" in line)
    no_room = [n for n, line in enumerate(lines) if line.startswith("BUDGET") and "no room left" in line]
    back = [n for n, line in enumerate(lines) if line.startswith("BUDGET") and "scored again" in line]
    first_poor, first_good = (int(re.search(r"\(from demo-(\d+)\)", lines[n])[1]) for n in (dip, recovered))  # type: ignore[index]

    def low_share(traces: range) -> float:
        """The share of the support bar's ratings under 6 of the traces produced in ``traces``
        (by their number, whenever they were rated: a busy machine rates them late)."""
        scores = [float(line.split()[1]) for line in lines
                  if line.startswith("RATING") and "support-quality" in line and line.split()[1] != "-"
                  and line.split()[3].startswith("demo-") and int(line.split()[3][5:]) in traces]
        assert len(scores) >= 5, (traces, scores)
        return sum(score < 6 for score in scores) / len(scores)

    assert low_share(range(first_poor)) < 0.5, "before the dip: mostly good"
    assert low_share(range(first_poor, first_good)) > 0.8, "the dip: the support bar's ratings fall"
    dip_signals = [line for line in lines if line.startswith("SIGNAL") and "scorer-group:support-quality" in line
                   and (found := re.search(r"\(demo-(\d+)\)$", line)) and first_poor <= int(found[1]) < first_good]
    assert dip_signals, "the dip's low results are Signals"
    assert low_share(range(first_good, 10**9)) < 0.5, "then it recovers (one cycle: no second dip)"
    assert any(line.startswith("RECEIVED") and "verified" in line for line in lines), "deliveries, verified"
    assert no_room and back and no_room[0] < back[0]
