"""The dataset gate fails closed, members keep their labels, additional scorers are accounted
for, and a catalog file's every error is listed at once ("What was found")."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.judge_server import JudgeServer
from scoring.errors import InvalidDocument
from services.groups import MonitorClient
from tests.support.datasets import grade_api, grade_cli, m
from tests.support.redis_clients import connect

pytestmark = pytest.mark.integration

LIVE = {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}
CATALOG = {
    "judges": [{"id": "quality", "name": "Quality", "criteria": "Helpful?", "model": "quality-model"},
               {"id": "quality-2", "name": "Quality", "criteria": "Helpful, strictly?", "model": "strict-model"},
               {"id": "exact", "name": "Exact", "criteria": "Matches?", "model": "exact-model",
                "requiresExpected": True},
               {"id": "tone", "name": "Tone", "criteria": "Polite?", "model": "tone-model"}],
    "patterns": [{"id": "pii", "name": "PII", "polarity": "failure", "template": "email"}],
    "groups": [
        {"id": "exact-gated", "name": "Exact gated", "projectId": "p",
         "members": [m("judge", "exact", gate=True), m("judge", "quality")]},
        {"id": "twins", "name": "Twins", "projectId": "p",
         "members": [m("judge", "quality"), m("judge", "quality-2")]},
        {"id": "toned", "name": "Toned", "projectId": "p",
         "members": [m("judge", "quality"), m("judge", "tone")]},
    ],
}
# The case: a must-pass judge that requires an expected answer, 3 of 4 rows without one.
ROWS = [{"input": "2+2?", "output": "4 [[rating@quality-model=8]]", "expected": "4 [[rating@exact-model=10]]"},
        {"input": "a", "output": "A [[rating@quality-model=8]]"},
        {"input": "b", "output": "B [[rating@quality-model=8]]"},
        {"input": "c", "output": "C [[rating@quality-model=8]]"}]
EXACT_UNSCORED = ('3 rows: No score: must-pass member "Exact" could not score '
                  "(judge requires an expected answer and this subject has none)")


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeServer]:
    with JudgeServer(default_rating=5) as s:
        yield s


@pytest.fixture
async def client(redis_db_url: str) -> AsyncIterator[MonitorClient]:
    redis = connect(redis_db_url)
    client = MonitorClient(redis)
    await client.apply(CATALOG)
    yield client
    await redis.aclose()


@pytest.fixture
def catalog_url(client: MonitorClient, redis_db_url: str) -> str:
    return redis_db_url


def rows_file(tmp_path: Path, rows: list[dict[str, Any]]) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize(("allow", "code", "says"), [
    ([], 1, "gate failed: 3 of 4 rows have no group 'Exact gated' score and 0 may "
            f"(allow_unscored / --allow-unscored): {EXACT_UNSCORED}"),
    (["--allow-unscored", "2"], 1, "3 of 4 rows have no group 'Exact gated' score and 2 may"),
    (["--allow-unscored", "0.5"], 1, "3 of 4 rows have no group 'Exact gated' score and 2 may"),
    (["--allow-unscored", "3"], 0, "gate passed: 9.00 >= 7"),
    (["--allow-unscored", "0.75"], 0, "gate passed: 9.00 >= 7"),
])
def test_rows_a_must_pass_member_could_not_score_fail_the_gate_unless_allowed(
        catalog_url: str, judge: JudgeServer, tmp_path: Path, allow: list[str], code: int, says: str) -> None:
    done = grade_cli(catalog_url, judge, "--group", "exact-gated", "--input", rows_file(tmp_path, ROWS),
                     "--fail-under", "7", *allow)
    assert done.returncode == code, done.stderr
    assert says in done.stderr
    assert [json.loads(line)["rating"] for line in done.stdout.splitlines()] == [9.0, None, None, None]


def test_a_bad_allowance_is_refused(catalog_url: str, judge: JudgeServer, tmp_path: Path) -> None:
    done = grade_cli(catalog_url, judge, "--group", "exact-gated", "--input", rows_file(tmp_path, ROWS),
                     "--fail-under", "7", "--allow-unscored", "1.5")
    assert done.returncode == 2 and "--allow-unscored: a fraction is between 0 and 1 (got 1.5)" in done.stderr


async def test_a_named_gate_fails_closed_on_rows_its_judge_could_not_score(
        catalog_url: str, judge: JudgeServer) -> None:
    from scorer_groups.gates import GateFailed

    run = await grade_api(catalog_url, judge, "exact-gated", ROWS)
    with pytest.raises(GateFailed, match=r"3 of 4 rows have no judge 'Exact' score and 0 may") as info:
        run.gate(fail_under=8, scorer="Exact")
    assert (info.value.unscored, info.value.allowed, info.value.value) == (3, 0, 10.0)
    assert run.gate(fail_under=8, scorer="Exact", allow_unscored=3) == 10.0
    with pytest.raises(GateFailed) as short:
        run.gate(fail_under=9.5, allow_unscored=3)
    assert short.value.shortfall == pytest.approx(0.5), "the exception carries the shortfall"


async def test_two_members_of_one_name_are_told_apart_and_an_ambiguous_gate_is_refused(
        catalog_url: str, judge: JudgeServer, client: MonitorClient, tmp_path: Path) -> None:
    group = await client.scorer_groups.get("twins")
    assert [x.label for x in group.members] == ["Quality [quality]", "Quality [quality-2]"]
    rows = [{"input": "q", "output": "x [[rating@quality-model=9]] [[rating@strict-model=4]]"}]
    run = await grade_api(catalog_url, judge, "twins", rows)
    assert run.judge_averages() == {"Quality [quality]": 9.0, "Quality [quality-2]": 4.0}, "never one average"
    done = grade_cli(catalog_url, judge, "--group", "twins", "--input", rows_file(tmp_path, rows),
                     "--fail-under", "5", "--scorer", "Quality")
    assert done.returncode == 2, "an ambiguous name is the gate's configuration, not a quality failure"
    assert ("judge name 'Quality' is ambiguous in group 'Twins': it names 2 members ('Quality [quality]', "
            "'Quality [quality-2]'); gate on one of their labels") in done.stderr
    strict = grade_cli(catalog_url, judge, "--group", "twins", "--input", rows_file(tmp_path, rows),
                       "--fail-under", "5", "--scorer", "Quality [quality-2]")
    assert strict.returncode == 1 and "judge 'Quality [quality-2]' average is 4.00, under 5 by 1.00" in strict.stderr
    assert grade_cli(catalog_url, judge, "--group", "twins", "--input", rows_file(tmp_path, rows),
                     "--fail-under", "5", "--scorer", "quality").returncode == 0, "a ref id names one member"


async def test_labels_are_kept_at_save_time_and_must_be_unique(client: MonitorClient) -> None:
    await client.scorers.put((await client.scorers.get("judges", "tone")).model_copy(update={"name": "Politeness"}))
    kept = await client.scorer_groups.update("toned", description="renamed its judge")
    assert [x.label for x in kept.members] == ["Quality", "Tone"], "the saved label outlives a rename"
    mine = await client.scorer_groups.create("Mine", [{**m("judge", "quality"), "label": "Helpfulness"},
                                                      m("judge", "tone")], project_id="p")
    assert [x.label for x in mine.members] == ["Helpfulness", "Politeness"]
    with pytest.raises(InvalidDocument) as info:
        await client.scorer_groups.create("Clash", [{**m("judge", "quality"), "label": "Same"},
                                                    {**m("judge", "tone"), "label": "Same"}], project_id="p")
    assert info.value.errors == ["members[1].label: 'Same' is already the label of members[0]; labels name "
                                 "members in results and gates, so each must be unique"]


async def test_a_deleted_judge_is_still_named_by_its_saved_label(
        catalog_url: str, judge: JudgeServer, client: MonitorClient, tmp_path: Path) -> None:
    await client.scorers.delete("judges", "tone")
    rows = [{"input": "q", "output": "ok [[rating@quality-model=8]]"}]
    run = await grade_api(catalog_url, judge, "toned", rows)
    assert run.rows[0].wire()["judgeScorerResults"][1]["label"] == "Tone"
    assert run.judge_averages() == {"Quality": 8.0, "Tone": None}
    done = grade_cli(catalog_url, judge, "--group", "toned", "--input", rows_file(tmp_path, rows),
                     "--fail-under", "5", "--scorer", "Tone")
    assert done.returncode == 1
    assert "1 of 1 rows have no judge 'Tone' score and 0 may (allow_unscored / --allow-unscored): " \
           "1 row: reference deleted" in done.stderr
    assert "no judge member named" not in done.stderr


def test_a_group_nulls_additional_scorers_and_says_so(catalog_url: str, judge: JudgeServer, tmp_path: Path) -> None:
    done = grade_cli(catalog_url, judge, "--group", "toned", "--additional-scorer-id", "pii",
                     "--additional-scorer-id", "exact", "--input", rows_file(tmp_path, ROWS[1:2]))
    assert done.returncode == 0, done.stderr
    assert ("warning: additional_scorer_ids nulled (pii, exact not graded): the group wins, and a run "
            "graded by group 'Toned' is graded by the group alone") in done.stderr
    row = json.loads(done.stdout)
    assert [j["scorerId"] for j in row["judgeScorerResults"]] == ["quality", "tone"] and row["scorerRows"] == []


def test_without_a_group_additional_scorers_are_graded_alongside(
        catalog_url: str, judge: JudgeServer, tmp_path: Path) -> None:
    rows = [{"input": "q", "output": "mail bob@example.com [[rating@quality-model=8]] [[rating@tone-model=2]]"}]
    done = grade_cli(catalog_url, judge, "--scorer-id", "quality", "--additional-scorer-id", "tone",
                     "--additional-scorer-id", "pii", "--input", rows_file(tmp_path, rows))
    assert done.returncode == 0, done.stderr
    assert ("note: additional scorers graded alongside 'Quality': tone, pii are reported on every row and "
            "do not change the rating") in done.stderr
    row = json.loads(done.stdout)
    assert row["rating"] == 8.0, "only the scorer itself fills the rating"
    assert [(j["label"], j["rating"]) for j in row["judgeScorerResults"]] == [("Quality", 8), ("Tone", 2)]
    assert [(s["name"], s["native"]) for s in row["scorerRows"]] == [("PII", True)]
    unknown = grade_cli(catalog_url, judge, "--scorer-id", "quality", "--additional-scorer-id", "nope",
                        "--input", rows_file(tmp_path, rows))
    assert unknown.returncode == 2 and "error: no scorer with id 'nope'" in unknown.stderr


async def test_catalog_apply_lists_every_error_of_a_file_at_once(client: MonitorClient) -> None:
    before = await client.store.version()
    bad = {
        "judges": [{"id": "broken", "name": "Broken"},  # no criteria
                   {"id": "fine", "name": "Fine", "criteria": "ok?", "requiresExpected": True}],
        "groups": [
            {"id": "refs", "name": "Refs", "projectId": "p",
             "members": [m("judge", "missing"), m("judge", "broken"), m("pattern", "gone")]},
            {"id": "rule", "name": "Rule", "projectId": "p", "online": LIVE,
             "members": [m("judge", "fine"), m("judge", "exact")]},
            {"id": "schema", "name": "Schema", "projectId": "p",
             "members": [m("judge", "quality", weight=-1), m("custom", "nothing")]},
            {"id": "labels", "name": "Labels", "projectId": "p",
             "members": [{**m("judge", "quality"), "label": "A"}, {**m("judge", "tone"), "label": "A"}]},
        ],
        "widgets": [],
    }
    with pytest.raises(InvalidDocument) as info:
        await client.apply(bad)
    rule = "has requiresExpected and cannot grade live traffic; disable requiresExpected or keep the " \
           "group's live scoring off"
    assert info.value.errors == [
        "widgets: not a kind of document (kinds: judges, patterns, customs, groups, budgets, channels, queues)",
        "judges[0] 'broken': criteria: Field required",
        "judges[1] 'fine': requiresExpected: judge 'Fine' is a member of group 'Rule' (rule) whose live "
        "scoring is enabled; a judge that requires an expected answer cannot grade live traffic",
        "groups[0] 'refs': members[0].refId: no LLM judge with id 'missing'",
        "groups[0] 'refs': members[2].refId: no pattern with id 'gone'",
        f"groups[1] 'rule': members[0].refId: judge 'Fine' {rule}",
        f"groups[1] 'rule': members[1].refId: judge 'Exact' {rule}",
        "groups[2] 'schema': members[0].weight: Input should be greater than or equal to 0 (got -1)",
        "groups[2] 'schema': members[1].refId: no custom evaluator with id 'nothing'",
        "groups[3] 'labels': members[1].label: 'A' is already the label of members[0]; labels name members "
        "in results and gates, so each must be unique",
    ]
    assert await client.store.version() == before, "nothing written"
