"""Grading a dataset run with a group: summary numbers by hand, gates (exit code and message),
the group-wins rule, requiresExpected with and without expected, deleted members."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.judge_server import JudgeServer
from scorer_groups.gates import GateFailed
from scoring.redact import REDACTED
from services.groups import MonitorClient
from tests.support.datasets import grade_api, grade_cli, m
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


CATALOG = {
    "judges": [{"id": "quality", "name": "Quality", "criteria": "Helpful?", "model": "quality-model"},
               {"id": "safety", "name": "Safety", "criteria": "Safe?", "model": "safety-model"},
               {"id": "exact", "name": "Exact", "criteria": "Matches the expected answer?",
                "model": "exact-model", "requiresExpected": True},
               {"id": "tone", "name": "Tone", "criteria": "Polite?", "model": "tone-model"}],
    "patterns": [{"id": "pii", "name": "PII", "polarity": "failure", "template": "email"},
                 {"id": "old-pattern", "name": "Old", "polarity": "failure", "contains": ["x"]}],
    "groups": [
        {"id": "release", "name": "Release quality bar", "projectId": "p",
         "members": [m("judge", "quality"), m("judge", "safety", gate=True), m("pattern", "pii", 0, True)]},
        # requiresExpected is allowed in a group that is not live
        {"id": "exact-gated", "name": "Exact gated", "projectId": "p",
         "members": [m("judge", "exact", gate=True), m("judge", "quality")]},
        {"id": "with-deleted", "name": "With deleted", "projectId": "p",
         "members": [m("judge", "quality"), m("judge", "tone", 5)]},
        {"id": "with-deleted-gate", "name": "With deleted gate", "projectId": "p",
         "members": [m("judge", "quality"), m("pattern", "old-pattern", 0, True)]},
    ],
}

ROWS = [
    {"input": "q0", "output": "All good. [[rating@quality-model=8]] [[rating@safety-model=9]]"},
    {"input": "q1", "output": "Fine. [[rating@quality-model=6]] [[rating@safety-model=7]]"},
    {"input": "q2", "output": "Mail bob@example.com [[rating@quality-model=9]] [[rating@safety-model=9]]"},
    {"input": "q3", "output": "Risky. [[rating@quality-model=7]] [[rating@safety-model=3]]"},
]
# By hand: rows score 8.5, 6.5, 0 (PII gate), 0 (Safety 3 < 5) -> run 3.75;
# Quality's own average (8+6+9+7)/4 = 7.5, Safety's (9+7+9+3)/4 = 7.0.


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeServer]:
    with JudgeServer(default_rating=5) as s:
        yield s


@pytest.fixture
async def catalog_url(redis_db_url: str) -> AsyncIterator[str]:
    url = redis_db_url
    redis = connect(url)
    client = MonitorClient(redis)
    await client.apply(CATALOG)
    # Deleted after the groups were built: they degrade at scoring time.
    await client.scorers.delete("judges", "tone")
    await client.scorers.delete("patterns", "old-pattern")
    yield url
    await redis.aclose()


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


async def test_summary_numbers_match_the_hand_computed_values(catalog_url: str, judge: JudgeServer) -> None:
    run = await grade_api(catalog_url, judge, "release", ROWS)
    assert [r.rating for r in run.rows] == [pytest.approx(8.5), pytest.approx(6.5), 0.0, 0.0]
    assert run.rating == pytest.approx(3.75)
    assert run.judge_averages() == {"Quality": pytest.approx(7.5), "Safety": pytest.approx(7.0)}
    assert run.breakdown()[0] == "Release quality bar (group): 3.75 (4 of 4 rows scored)"
    row = run.rows[0].wire()
    assert [(j["label"], j["rating"]) for j in row["judgeScorerResults"]] == [("Quality", 8), ("Safety", 9)]
    assert [(s["name"], s["native"], s["goodness"]) for s in row["scorerRows"]] == [("PII", False, 1.0)]
    assert run.gate(fail_under=3) == pytest.approx(3.75)
    with pytest.raises(GateFailed, match=r"group 'Release quality bar' score is 3.75, under 7 by 3.25"):
        run.gate(fail_under=7)
    assert run.gate(fail_under=7, scorer="Safety") == pytest.approx(7.0)
    with pytest.raises(GateFailed, match=r"judge 'Safety' average is 7.00, under 8 by 1.00"):
        run.gate(fail_under=8, scorer="Safety")


@pytest.mark.parametrize(("args", "code", "says"), [
    (["--fail-under", "3"], 0, "gate passed: 3.75 >= 3"),
    (["--fail-under", "7"], 1, "gate failed: group 'Release quality bar' score is 3.75, under 7 by 3.25"),
    (["--fail-under", "7", "--scorer", "Safety"], 0, "gate passed: 7.00 >= 7"),
    (["--fail-under", "8", "--scorer", "Safety"], 1, "gate failed: judge 'Safety' average is 7.00, under 8 by 1.00"),
    # A gate on a name that is no judge member is a configuration error (2), not a failed gate (1).
    (["--fail-under", "8", "--scorer", "PII"], 2,
     "error: no judge member named 'PII' in group 'Release quality bar' (judge members: 'Quality', 'Safety')"),
    (["--fail-under", "8", "--scorer", "Saftey"], 2, "error: no judge member named 'Saftey'"),
])
def test_cli_gates_exit_code_and_message(catalog_url: str, judge: JudgeServer, rows_file: Path,
                                         tmp_path: Path, args: list[str], code: int, says: str) -> None:
    out = tmp_path / "rows.jsonl"
    done = grade_cli(catalog_url, judge, "--group", "release", "--input", str(rows_file),
                     "--output", str(out), *args)
    assert done.returncode == code, done.stderr
    assert says in done.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["rating"] for line in lines] == [pytest.approx(8.5), pytest.approx(6.5), 0.0, 0.0]
    summary = json.loads(done.stderr[done.stderr.index("{"):done.stderr.rindex("}") + 1])
    assert summary["breakdown"][0].startswith("Release quality bar (group)")
    assert (summary["rows"], summary["scoredRows"], summary["noScoreRows"]) == (4, 4, 0)


def test_group_wins_over_a_single_scorer_and_drops_additional_scorers(
        catalog_url: str, judge: JudgeServer, rows_file: Path) -> None:
    done = grade_cli(catalog_url, judge, "--group", "release", "--scorer-id", "tone",
                     "--additional-scorer-id", "pii", "--input", str(rows_file))
    assert done.returncode == 0, done.stderr
    assert "warning: scorer_id 'tone' ignored: scorer_group_id and scorer_id are mutually exclusive and the group wins" in done.stderr
    assert "warning: additional_scorer_ids nulled (pii not graded): the group wins" in done.stderr
    ratings = [json.loads(line)["rating"] for line in done.stdout.splitlines()]
    assert ratings == [pytest.approx(8.5), pytest.approx(6.5), 0.0, 0.0], "graded by the group"


async def test_requires_expected_with_and_without_expected(catalog_url: str, judge: JudgeServer) -> None:
    rows = [{"input": "2+2?", "output": "4 [[rating@quality-model=6]]", "expected": "4 [[rating@exact-model=10]]"},
            {"input": "3+3?", "output": "6 [[rating@quality-model=6]]"}]
    run = await grade_api(catalog_url, judge, "exact-gated", rows)
    with_expected, without = run.rows
    assert with_expected.rating == pytest.approx(8.0), "Exact read the row's expected"
    assert "Expected answer:" in next(r["messages"][-1]["content"] for r in judge.requests
                                      if r["model"] == "exact-model")
    assert without.rating is None
    assert without.result.blend.reason == ('No score: must-pass member "Exact" could not score '
                                           "(judge requires an expected answer and this subject has none)")
    assert run.summary()["noScoreRows"] == 1 and run.rating == pytest.approx(8.0), "no-score rows counted apart"


async def test_deleted_members_degrade_or_fail_closed(catalog_url: str, judge: JudgeServer) -> None:
    rows = [{"input": "q", "output": "ok [[rating@quality-model=8]]"}]
    degraded = await grade_api(catalog_url, judge, "with-deleted", rows)
    assert degraded.rows[0].rating == pytest.approx(8.0), "the deleted Tone (weight 5) left the average"
    assert degraded.rows[0].wire()["judgeScorerResults"][1] == {
        "scorerId": "tone", "label": "Tone", "status": "not_scored", "rating": None,
        "justification": None, "error": "reference deleted"}
    closed = await grade_api(catalog_url, judge, "with-deleted-gate", rows)
    assert closed.rows[0].rating is None
    # Named by the label the group saved (the pattern's name then), not by its raw ref id.
    assert closed.rows[0].result.blend.reason == 'No score: must-pass member "Old" could not score (reference deleted)'
    assert "Tone not scored (reference deleted)" in degraded.rows[0].result.blend.justification


async def test_publish_sends_each_row_to_the_ratings_topic_as_dataset(
        catalog_url: str, judge: JudgeServer, rows_file: Path, kafka_bootstrap: str, unique: str) -> None:
    from tests.support.harness import read_topic

    topic = f"dataset-ratings-{unique}"
    done = grade_cli(catalog_url, judge, "--group", "release", "--input", str(rows_file), "--publish",
                     env={"SGW_KAFKA_BOOTSTRAP": kafka_bootstrap, "SGW_RATINGS_TOPIC": topic})
    assert done.returncode == 0, done.stderr
    published = await read_topic(kafka_bootstrap, topic, until=lambda v: len(v) >= 4, timeout_s=30)
    assert sorted(p["row"] for p in published) == [0, 1, 2, 3]
    assert {p["scope"] for p in published} == {"dataset"} and len({p["runId"] for p in published}) == 1
    assert sorted(p["rating"] for p in published) == [0.0, 0.0, pytest.approx(6.5), pytest.approx(8.5)]


class _Terminal:
    def __init__(self, tty: bool) -> None:
        self.text, self._tty = "", tty

    def isatty(self) -> bool:
        return self._tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_elsewhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from worker import grading

    monkeypatch.setattr(grading, "PROGRESS_AFTER_S", 0.0)
    tty, pipe = _Terminal(True), _Terminal(False)
    for stream in (tty, pipe):
        progress = grading.Progress(stream)  # type: ignore[arg-type]
        for done in range(1, 11):
            progress(done, 10)
    assert "\r[" in tty.text and "10/10 rows" in tty.text and tty.text.endswith("\n")
    assert "\r" not in pipe.text and pipe.text.splitlines()[-1].startswith("graded 10/10 rows")


def test_cli_reports_agreement_with_the_rows_human_verdicts(catalog_url: str, judge: JudgeServer,
                                                            tmp_path: Path) -> None:
    labelled = tmp_path / "labelled.jsonl"
    verdicts = [{"humanRating": 9}, {"humanRating": 5}, {"humanPass": False}, {"humanRating": 1}]
    labelled.write_text("".join(json.dumps({**row, **v}) + "\n" for row, v in zip(ROWS, verdicts, strict=True)))
    done = grade_cli(catalog_url, judge, "--group", "release", "--input", str(labelled),
                     "--output", str(tmp_path / "out.jsonl"))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stderr[done.stderr.index("{"):done.stderr.rindex("}") + 1])
    agreement = summary["agreement"]
    assert (agreement["labelledRows"], agreement["humanRatings"]) == (4, 3)
    assert [j["label"] for j in agreement["judges"]] == ["Quality", "Safety"]
    group = agreement["group"]  # rows score 8.5, 6.5, 0, 0 against 9, 5, (fail), 1
    assert group["meanAbsoluteError"] == pytest.approx((0.5 + 1.5 + 1) / 3, abs=1e-4)
    assert group["marks"][0]["confusion"] == {"bothPass": 2, "machinePassPeopleFail": 0,
                                              "machineFailPeoplePass": 0, "bothFail": 2}
    assert "agreement with people: 4 labelled rows (3 with a humanRating)" in done.stderr
    assert "  group 'Release quality bar': 4 rows, spearman 1.00, MAE 1.00, kappa 1.00 at the gate mark 5" in done.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**ROWS[0], "humanRating": "nine"}) + "\n")
    refused = grade_cli(catalog_url, judge, "--group", "release", "--input", str(bad))
    assert refused.returncode == 2 and "row 0: humanRating must be a number from 0 to 10" in refused.stderr, refused.stderr


def test_a_templates_labelled_rows_grade_into_an_agreement(catalog_url: str, judge: JudgeServer,
                                                           tmp_path: Path) -> None:
    import subprocess
    import sys

    from scoring.judge_templates import BY_NAME

    listed = subprocess.run([sys.executable, "-m", "worker.cli", "templates", "faithfulness", "--examples"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = tmp_path / "faithfulness.jsonl"
    rows.write_text(listed.stdout)
    assert [json.loads(line) for line in listed.stdout.splitlines()] == list(BY_NAME["faithfulness"].examples)
    done = grade_cli(catalog_url, judge, "--scorer-id", "quality", "--input", str(rows),
                     "--output", str(tmp_path / "out.jsonl"))
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stderr[done.stderr.index("{"):done.stderr.rindex("}") + 1])
    assert summary["agreement"]["labelledRows"] == len(BY_NAME["faithfulness"].examples)
    assert "agreement with people: 6 labelled rows (6 with a humanRating)" in done.stderr


def test_with_calls_each_line_carries_what_each_judge_was_sent_masked(catalog_url: str, judge: JudgeServer,
                                                                       tmp_path: Path) -> None:
    key = "sk-judge-7c1e9a2b4d6f8a0c"
    rows = tmp_path / "run.jsonl"
    rows.write_text(json.dumps({"input": "q9", "output": f"Leaked {key} [[rating@quality-model=8]]"}) + "\n")
    done = grade_cli(catalog_url, judge, "--group", "release", "--input", str(rows), "--with-calls",
                     env={"SGW_JUDGE_API_KEY": key})
    assert done.returncode == 0, done.stderr
    (line,) = [json.loads(text) for text in done.stdout.splitlines()]
    calls = {call["member"]: call for call in line["judgeCalls"]}
    assert set(calls) == {"Quality", "Safety"}
    quality = calls["Quality"]
    sent = next(r for r in judge.requests if r["model"] == "quality-model" and "q9" in r["messages"][-1]["content"])
    question = quality["messages"][-1]["content"]
    assert key not in json.dumps(line) and key in sent["messages"][-1]["content"], "masked in the line alone"
    assert question == sent["messages"][-1]["content"].replace(key, REDACTED), "the exact question, the key masked"
    without = grade_cli(catalog_url, judge, "--group", "release", "--input", str(rows))
    assert "judgeCalls" not in json.loads(without.stdout.splitlines()[0])


def test_a_dataset_run_repeated_calls_no_judge_and_no_cache_calls_them_all(
        catalog_url: str, judge: JudgeServer, rows_file: Path) -> None:
    def run(*extra: str) -> tuple[int, list[Any]]:
        before = len(judge.requests)
        done = grade_cli(catalog_url, judge, "--group", "release", "--input", str(rows_file), *extra)
        assert done.returncode == 0, done.stderr
        return len(judge.requests) - before, [json.loads(line) for line in done.stdout.splitlines()]

    calls, first = run()
    assert calls == 8, "4 rows x 2 judges, asked the first time"
    calls, again = run()
    assert calls == 0, "the same run against the unchanged judges: every verdict paid for already"
    assert [r["rating"] for r in again] == [r["rating"] for r in first]
    assert [j["rating"] for r in again for j in r["judgeScorerResults"]] == \
        [j["rating"] for r in first for j in r["judgeScorerResults"]]
    calls, fresh = run("--no-cache")
    assert calls == 8, "--no-cache: every judge asked afresh"
    assert [r["rating"] for r in fresh] == [r["rating"] for r in first]


def test_a_runs_summary_says_what_its_judges_cost_and_unknown_when_a_model_has_no_price(
        catalog_url: str, judge: JudgeServer, rows_file: Path) -> None:
    def spend(prices: str) -> dict[str, Any]:
        del judge.requests[:]
        done = grade_cli(catalog_url, judge, "--group", "release", "--input", str(rows_file), "--no-cache",
                         env={"SGW_JUDGE_PRICES": prices})
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stderr[done.stderr.index("{"):done.stderr.rindex("}") + 1])["spend"])

    both = spend('{"quality-model": {"input": 1, "output": 2}, "safety-model": {"input": 1, "output": 2}}')
    assert (both["judgeCalls"], both["unpricedCalls"]) == (8, 0)
    # The local judge counts words: the prompt's from what it was sent, the answer's the rest.
    prompt = sum(len(str(m["content"]).split()) for r in judge.requests for m in r["messages"])
    completion = both["tokens"] - prompt
    assert completion > 0 and both["cost"] == pytest.approx((prompt * 1 + completion * 2) / 1e6)
    one = spend('{"quality-model": {"input": 1, "output": 2}}')
    assert (one["judgeCalls"], one["unpricedCalls"], one["cost"]) == (8, 4, None), "unknown, never a partial sum"
