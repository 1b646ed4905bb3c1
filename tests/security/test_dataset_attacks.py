"""A tenant against dataset runs (items 2 and 3), on the real API process, Redis and
the local judge:

- a run spends the project's judge budget like everything else: against a budget of 0 (calls,
  or tokens) no judge is called and every row is named skipped; a budget of N grades whole rows
  only, never a partial panel;
- reading runs never reads a large run whole: a page of runs and a row's judge calls read the
  runs' summaries (counted in the bytes Redis sends), a run kept before summaries were is read
  whole once;
- the project's quotas refuse the dataset, the run or the bytes one past them, naming the quota.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from adapters.stores import keys
from devtools.judge_server import JudgeServer
from scorer_groups import Client
from tests.support.api_process import ApiProcess, api_with_judge, cli, create_key
from tests.support.redis_clients import connect_sync
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

SUBJECT = {"kind": "custom_agent", "displayName": "attacker"}


def _operator(process: ApiProcess) -> httpx.Client:
    return process.client(create_key(process.redis_url, "--operator"))


def _two_judge_group(client: Client) -> str:
    quality = client.monitor.judges.create(name="Quality", criteria="Helpful?", model="quality-model")
    safety = client.monitor.judges.create(name="Safety", criteria="Safe?", model="safety-model")
    group = client.monitor.scorer_groups.create("Panel", members=[{"kind": "judge", "refId": quality.id, "weight": 1},
                                                                  {"kind": "judge", "refId": safety.id, "weight": 1}])
    return group.id


def _used(operator: httpx.Client, project: str) -> dict[str, Any]:
    answer = operator.get(f"/v1/budgets/{project}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["used"])


@pytest.fixture
def budgeted(redis_databases: RedisDatabases, tmp_path: Path) -> Iterator[tuple[ApiProcess, str, JudgeServer]]:
    with api_with_judge(redis_databases, tmp_path, "p-budget") as api:
        yield api


@pytest.mark.parametrize("budget", [{"judgeCallsPerWindow": 0},
                                    {"judgeCallsPerWindow": 1_000, "judgeTokensPerWindow": 0}],
                         ids=["calls", "tokens"])
def test_a_run_against_a_spent_budget_calls_no_judge_and_names_every_row_skipped(
        budgeted: tuple[ApiProcess, str, JudgeServer], budget: dict[str, int]) -> None:
    process, key, judge = budgeted
    with _operator(process) as operator, Client(process.url, key) as client:
        assert operator.put("/v1/budgets/p-budget", json=budget).status_code == 200
        group = _two_judge_group(client)
        dataset = client.datasets.create("Twenty", rows=[{"input": f"question {i}"} for i in range(20)])
        run = client.evaluations.run(dataset_id=dataset.id, subject=SUBJECT, scorer_group_id=group).execute(
            lambda q: f"answer to {q}").finalize().run
        used = _used(operator, "p-budget")
        calls = client.evaluations.calls(run.id, 7)
    assert judge.requests == [], "not one judge call"
    assert run.budget_skipped_rows == list(range(20)) and run.scored_rows == 0 and run.no_score_rows == 20
    assert any("20 rows not graded" in note and "judge budget" in note for note in run.notes), run.notes
    assert all(row["skipped"] == "budget" and row["judgeScorerResults"] == [] for row in run.rows)
    assert calls.calls == [] and calls.note is not None and "judge budget" in calls.note
    assert (used["judgeCalls"], used["judgeTokens"]) == (0, 0)


def test_the_clis_grade_reserves_from_the_projects_budget_unless_the_operator_says_outside(
        budgeted: tuple[ApiProcess, str, JudgeServer], tmp_path: Path) -> None:
    """The bypass: a five-row ``scorer-worker grade`` over a judge group made 5 judge calls with
    the project's budget at 0 (the API's dataset runs reserved; the CLI's did not)."""
    process, key, judge = budgeted
    with _operator(process) as operator, Client(process.url, key) as client:
        assert operator.put("/v1/budgets/p-budget", json={"judgeCallsPerWindow": 0}).status_code == 200
        group = _two_judge_group(client)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"input": "question {i}", "output": "answer {i}"}}\n' for i in range(5)))
    env = {"SGW_JUDGE_BASE_URL": judge.base_url}
    graded = cli(process.redis_url, "grade", "--group", group, "--input", str(rows), env=env)
    assert graded.returncode == 0, graded.stderr
    assert judge.requests == [], "not one judge call"
    assert graded.stdout == "", "no row was graded: no line"
    assert '"budgetSkippedRows": [\n    0,\n    1,\n    2,\n    3,\n    4\n  ]' in graded.stderr
    assert '"judgeBudget": "project p-budget"' in graded.stderr
    assert "5 of 5 rows were not graded" in graded.stderr
    gated = cli(process.redis_url, "grade", "--group", group, "--input", str(rows), "--fail-under", "5", env=env)
    assert gated.returncode == 1 and "gate failed: 5 of 5 rows have no score" in gated.stderr, gated.stderr
    assert judge.requests == []
    outside = cli(process.redis_url, "grade", "--group", group, "--input", str(rows), "--outside-budget", env=env)
    assert outside.returncode == 0, outside.stderr
    assert len(judge.requests) == 10 and len(outside.stdout.splitlines()) == 5
    assert '"judgeBudget": "outside (--outside-budget)"' in outside.stderr
    with _operator(process) as operator:
        assert _used(operator, "p-budget")["judgeCalls"] == 0, "outside the budget: not counted in it"


def test_a_budget_of_n_calls_grades_whole_rows_only(budgeted: tuple[ApiProcess, str, JudgeServer]) -> None:
    process, key, judge = budgeted
    with _operator(process) as operator, Client(process.url, key) as client:
        assert operator.put("/v1/budgets/p-budget", json={"judgeCallsPerWindow": 5}).status_code == 200
        group = _two_judge_group(client)
        dataset = client.datasets.create("Six", rows=[{"input": f"question {i}"} for i in range(6)])
        run = client.evaluations.run(dataset_id=dataset.id, subject=SUBJECT, scorer_group_id=group).execute(
            lambda q: f"answer to {q}").finalize().run
        used = _used(operator, "p-budget")
    # 5 calls hold two rows of two judges: the third row's pair does not fit, half of it is never called.
    assert len(judge.requests) == 4 and used["judgeCalls"] == 4
    assert run.budget_skipped_rows == [2, 3, 4, 5] and run.scored_rows == 2
    graded = [row for row in run.rows if not row.get("skipped")]
    assert [len(row["judgeScorerResults"]) for row in graded] == [2, 2]
    assert all(r["rating"] is not None for row in graded for r in row["judgeScorerResults"])


# --- reading runs ---------------------------------------------------------------------------------

LARGE_ROWS, OUTPUT_CHARS = 40, 100_000  # a run of ~4 MB: its rows keep the agent's outputs


def _sent_by_redis(redis_url: str) -> int:
    """Bytes the Redis server has sent its clients so far."""
    info = connect_sync(redis_url).info("stats")
    return int(info["total_net_output_bytes"])


@pytest.fixture(scope="module")
def large_runs(redis_databases: RedisDatabases,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str, list[str]]]:
    with api_with_judge(redis_databases, tmp_path_factory.mktemp("api"), "p-large") as (process, key, _):
        with Client(process.url, key, timeout_s=120) as client:
            pattern = client.monitor.patterns.create(name="PII", polarity="failure", template="email")
            dataset = client.datasets.create("Long answers", rows=[{"input": f"q{i}"} for i in range(LARGE_ROWS)])
            runs = [client.evaluations.run(dataset_id=dataset.id, subject=SUBJECT, scorer_id=pattern.id).execute(
                        lambda q: q + " " + "x" * OUTPUT_CHARS).finalize().run.id for _ in range(3)]
        yield process, key, runs


def test_a_page_of_runs_and_a_rows_calls_never_read_a_run_whole(large_runs: tuple[ApiProcess, str, list[str]]) -> None:
    process, key, runs = large_runs
    stored = sum(len(connect_sync(process.redis_url).get(keys.evaluation("p-large", r)) or b"") for r in runs)
    assert stored > 3 * LARGE_ROWS * OUTPUT_CHARS
    with process.client(key) as api:
        before = _sent_by_redis(process.redis_url)
        page = api.get("/v1/evaluations", params={"limit": 2})
        row = api.get(f"/v1/evaluations/{runs[0]}/rows/3/calls")
        beyond = api.get(f"/v1/evaluations/{runs[1]}/rows/{LARGE_ROWS}/calls")
        read = _sent_by_redis(process.redis_url) - before
    assert page.status_code == 200 and len(page.json()["items"]) == 2 and page.json()["nextCursor"]
    assert all(item["rows"] == [] and item["rowCount"] == LARGE_ROWS for item in page.json()["items"])
    assert row.status_code == 200 and row.json()["note"] == "no judge graded this row"
    assert beyond.status_code == 404
    assert read < 256 * 1024, f"{read} bytes read from Redis for a page and two rows ({stored} stored)"


def _held(process: ApiProcess, bound: str) -> float:
    """The API's event-loop ticks later than ``bound`` seconds so far (sgw_event_loop_stall_seconds)."""
    metrics = httpx.get(process.url + "/metrics", timeout=10).text
    count = float(re.search(r"^sgw_event_loop_stall_seconds_count (\S+)$", metrics, re.M).group(1))  # type: ignore[union-attr]
    within = float(re.search(rf'^sgw_event_loop_stall_seconds_bucket{{le="{bound}"}} (\S+)$',  # type: ignore[union-attr]
                             metrics, re.M).group(1))
    return count - within


HUGE_OUTPUT_CHARS = 800_000  # 40 rows: a run of ~32 MB, as the attack's


@pytest.fixture(scope="module")
def huge_run(redis_databases: RedisDatabases,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str, list[str]]]:
    with api_with_judge(redis_databases, tmp_path_factory.mktemp("api"), "p-huge") as (process, key, _):
        with Client(process.url, key, timeout_s=300) as client:
            pattern = client.monitor.patterns.create(name="PII", polarity="failure", template="email")
            dataset = client.datasets.create("Longer answers", rows=[{"input": f"q{i}"} for i in range(LARGE_ROWS)])
            run = client.evaluations.run(dataset_id=dataset.id, subject=SUBJECT, scorer_id=pattern.id).execute(
                lambda q: q + " " + "x" * HUGE_OUTPUT_CHARS).finalize().run.id
        yield process, key, [run]


# Alone: it times the API's event loop, and a neighbour test's load on this 2-core machine holds a
# process unscheduled past 0.25 s now and then (CI failed on it once) - starvation, not the loop.
@pytest.mark.alone
async def test_sixteen_reads_of_a_huge_run_at_once_hold_neither_the_loop_nor_redis(
        huge_run: tuple[ApiProcess, str, list[str]]) -> None:
    """A run read whole is checked and encoded beside the event loop, a project's few at a time:
    16 reads at once answer 200 each, the same document, and no tick of the loop is held past
    0.25 s (before: some answered 500 - Redis timeouts - and the loop was held past it)."""
    process, key, runs = huge_run
    held_before = await asyncio.to_thread(_held, process, "0.25")
    async with httpx.AsyncClient(base_url=process.url, headers={"Authorization": f"Bearer {key}"},
                                 timeout=120) as api:
        answers = await asyncio.gather(*(api.get(f"/v1/evaluations/{runs[0]}") for _ in range(16)))
    assert [a.status_code for a in answers] == [200] * 16
    assert len({a.content for a in answers}) == 1 and answers[0].json()["rowCount"] == LARGE_ROWS
    assert len(answers[0].json()["rows"]) == LARGE_ROWS
    late = await asyncio.to_thread(_held, process, "0.25") - held_before
    assert late == 0, f"the API's loop was held past 0.25 s {late:g} times"


def test_a_run_kept_before_summaries_is_read_whole_once(large_runs: tuple[ApiProcess, str, list[str]]) -> None:
    process, key, runs = large_runs
    redis = connect_sync(process.redis_url)
    # As a run was kept before: the run and the project's index of runs, nothing beside them.
    redis.hdel(keys.evaluation_summaries("p-large"), runs[2])
    redis.hdel(keys.evaluation_sizes("p-large"), runs[2])
    redis.delete(keys.evaluation_rows("p-large", runs[2]))
    with process.client(key) as api:
        first = api.get("/v1/evaluations")
        before = _sent_by_redis(process.redis_url)
        again = api.get("/v1/evaluations")
        row = api.get(f"/v1/evaluations/{runs[2]}/rows/0/calls")
        read = _sent_by_redis(process.redis_url) - before
    assert first.status_code == again.status_code == 200
    assert sorted(i["id"] for i in first.json()["items"]) == sorted(i["id"] for i in again.json()["items"]) == sorted(runs)
    assert row.status_code == 200 and row.json()["note"] == "no judge graded this row"
    assert read < 256 * 1024, f"{read} bytes read from Redis once the old run was indexed"


# --- quotas ---------------------------------------------------------------------------------------

def test_the_quotas_refuse_the_one_past_them_naming_the_quota(redis_databases: RedisDatabases, tmp_path: Path) -> None:
    quotas = {"SGW_MAX_DATASETS_PER_PROJECT": "2", "SGW_MAX_EVALUATION_RUNS_PER_PROJECT": "2",
              "SGW_MAX_PROJECT_STORED_BYTES": "200000"}
    with api_with_judge(redis_databases, tmp_path, "p-quota", env=quotas) as (process, key, _), \
            Client(process.url, key) as client, process.client(key) as api:
        pattern = client.monitor.patterns.create(name="PII", polarity="failure", template="email")
        small = client.datasets.create("Small", rows=[{"input": "hi"}])
        too_large = api.post("/v1/datasets", json={"name": "Large", "content": '{"input": "' + "x" * 250_000 + '"}'})
        assert too_large.status_code == 409, too_large.text
        assert too_large.json()["quota"]["setting"] == "SGW_MAX_PROJECT_STORED_BYTES"
        assert "SGW_MAX_PROJECT_STORED_BYTES" in too_large.json()["detail"]
        client.datasets.create("Second", rows=[{"input": "hello"}])
        third = api.post("/v1/datasets", json={"name": "Third", "content": '{"input": "hey"}'})
        assert third.status_code == 409 and third.json()["quota"] == {
            "setting": "SGW_MAX_DATASETS_PER_PROJECT", "used": 2, "limit": 2}
        body = {"datasetId": small.id, "subject": SUBJECT, "scorerId": pattern.id}
        assert [api.post("/v1/evaluations", json=body).status_code for _ in range(2)] == [201, 201]
        refused = api.post("/v1/evaluations", json=body)
        assert refused.status_code == 409 and refused.json()["quota"] == {
            "setting": "SGW_MAX_EVALUATION_RUNS_PER_PROJECT", "used": 2, "limit": 2}
        assert "SGW_MAX_EVALUATION_RUNS_PER_PROJECT" in refused.json()["detail"]
        assert len(api.get("/v1/evaluations").json()["items"]) == 2
