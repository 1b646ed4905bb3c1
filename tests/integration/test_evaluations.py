"""Dataset runs graded server-side: the spec's dataset-run snippet verbatim (only the client is
constructed here) against the real API process, Redis and the local judge; gates that fail
closed on rows the agent failed; the group-wins warnings; runs fetched back later."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.judge_server import JudgeServer
from scorer_groups import Client, GateFailed, NotAJudgeMember, NotFound
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_clients import connect_sync
from tests.support.redis_databases import RedisDatabases
from tests.support.spec_snippets import RUN_SNIPPET, SPEC

pytestmark = pytest.mark.integration

ROWS = [{"input": "What is 2+2?", "expected": "4"}, {"input": "Capital of France?"},
        {"input": "Say hi", "metadata": {"lang": "en"}}]


@pytest.fixture(scope="module")
def judge() -> Iterator[JudgeServer]:
    with JudgeServer(default_rating=5) as s:
        yield s


@pytest.fixture(scope="module")
def api_process(redis_databases: RedisDatabases, judge: JudgeServer,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str, str]]:
    with redis_databases.lease() as url:
        key = create_key(url, "--project", "p-eval")
        before = os.environ.get("SGW_JUDGE_BASE_URL")
        os.environ["SGW_JUDGE_BASE_URL"] = judge.base_url  # the API process grades with this judge
        try:
            process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        finally:
            if before is None:
                os.environ.pop("SGW_JUDGE_BASE_URL")
            else:
                os.environ["SGW_JUDGE_BASE_URL"] = before
        try:
            yield process, key, url
        finally:
            process.stop()


@pytest.fixture(scope="module")
def api_address(api_process: tuple[ApiProcess, str, str]) -> tuple[str, str, str]:
    process, key, url = api_process
    return process.url, key, url


@pytest.fixture
def names(api_address: tuple[str, str, str]) -> Iterator[dict[str, Any]]:
    client = Client(api_address[0], api_address[1])
    quality = client.monitor.judges.create(name="Quality", criteria="Helpful?", model="quality-model")
    safety = client.monitor.judges.create(name="Safety", criteria="Safe?", model="safety-model")
    pii = client.monitor.patterns.create(name="PII", polarity="failure", template="email")
    dataset = client.datasets.create("Release questions", rows=ROWS)
    yield {"client": client, "quality": quality, "safety": safety, "pii": pii, "dataset": dataset}
    client.close()


def agent_rating(quality: int, safety: int) -> Any:
    def my_agent(question: str) -> str:
        return f"An answer to {question} [[rating@quality-model={quality}]] [[rating@safety-model={safety}]]"
    return my_agent


def test_the_snippet_is_the_specs() -> None:
    if not SPEC.exists():
        pytest.skip(f"the spec is not next to the repository ({SPEC})")
    assert RUN_SNIPPET in SPEC.read_text()


def test_the_specs_dataset_run_runs_verbatim(names: dict[str, Any], judge: JudgeServer, api_address: tuple[str, str, str]) -> None:
    names["my_agent"] = agent_rating(quality=8, safety=9)
    exec(RUN_SNIPPET, names)
    run = names["run"]
    assert run.status == "completed" and run.dataset_version == 1 and run.row_count == 3
    assert run.rating == pytest.approx(8.5), "(8/10 + 9/10) / 2, PII clean"
    assert run.breakdown == ["Release quality bar (group): 8.50 (3 of 3 rows scored)", "Quality: 8.00", "Safety: 9.00"]
    assert [[(j["label"], j["rating"]) for j in row] for row in run.judge_scorer_results] == \
        [[("Quality", 8), ("Safety", 9)]] * 3
    assert [[(s["name"], s["native"]) for s in row] for row in run.scorer_rows] == [[("PII", False)]] * 3
    assert {r["model"] for r in judge.requests} >= {"quality-model", "safety-model"}, "the server judged"
    # Kept: the run is fetched back, every row with its output and result.
    again = names["client"].evaluations.get(run.id)
    assert again.rows == run.rows and again.rows[1]["output"].startswith("An answer to Capital of France?")
    assert run.id in [r.id for r in names["client"].evaluations.list()]


def test_a_gate_under_the_bar_raises_with_the_shortfall(names: dict[str, Any]) -> None:
    client, group = names["client"], _group(names)
    run = client.evaluations.run(dataset_id=names["dataset"].id, subject={"kind": "custom_agent", "displayName": "a"},
                                 scorer_group_id=group.id).execute(agent_rating(quality=8, safety=7)).finalize()
    assert run.gate(fail_under=7) == pytest.approx(7.5)
    with pytest.raises(GateFailed, match=r"judge 'Safety' average is 7.00, under 8 by 1.00") as info:
        run.gate(fail_under=8, scorer="Safety")
    assert info.value.shortfall == pytest.approx(1.0)


def test_rows_the_agent_failed_on_fail_the_gate_unless_allowed(names: dict[str, Any]) -> None:
    client, group = names["client"], _group(names)
    calls: list[str] = []

    def flaky(question: str) -> str:
        calls.append(question)
        if question == "Say hi":
            raise RuntimeError("model overloaded")
        return "ok [[rating@quality-model=9]] [[rating@safety-model=9]]"

    run = client.evaluations.run(dataset_id=names["dataset"].id, subject={"kind": "custom_agent", "displayName": "a"},
                                 scorer_group_id=group.id).execute(flaky, retries=2).finalize()
    assert calls.count("Say hi") == 3, "tried, then retried twice"
    assert [r["rating"] for r in run.rows] == [9.0, 9.0, None]
    with pytest.raises(GateFailed, match=r"1 of 3 rows have no group 'Release quality bar' score and 0 may .*"
                                         r"1 row: No score: the agent failed on this row \(RuntimeError: model overloaded\)"):
        run.gate(fail_under=7)
    assert run.gate(fail_under=7, allow_unscored=1) == 9.0
    assert run.gate(fail_under=7, allow_unscored=0.34) == 9.0


def test_each_rows_judge_calls_are_kept_with_the_run_and_only_for_its_project(
        names: dict[str, Any], judge: JudgeServer, api_address: tuple[str, str, str]) -> None:
    # What a failed CI gate sends people to read: the exact question each judge got on a row.
    client, group = names["client"], _group(names)

    def agent(question: str) -> str:
        if question == "Say hi":
            raise RuntimeError("model overloaded")
        return f"Answer to {question} [[rating@quality-model=3]] [[rating@safety-model=9]]"

    run = client.evaluations.run(dataset_id=names["dataset"].id, subject={"kind": "custom_agent", "displayName": "a"},
                                 scorer_group_id=group.id).execute(agent, retries=0).finalize()
    row = client.evaluations.calls(run.id, 1)
    assert row.row == 1 and row.note is None
    assert [(c.member, c.model) for c in row.calls] == [("Quality", "quality-model"), ("Safety", "safety-model")]
    sent = {r["model"]: r["messages"] for r in judge.requests
            if "Answer to Capital of France?" in r["messages"][-1]["content"]}
    for call in row.calls:
        assert [(m.role, m.content) for m in call.messages] == [(m["role"], m["content"]) for m in sent[call.model]]
        assert call.answer and call.attempts == 1 and call.error is None
    failed = client.evaluations.calls(run.id, 2)
    assert failed.calls == [] and failed.note == "the agent failed on this row: nothing was graded"
    assert not any("judge calls" in n for n in run.notes), "every row's calls fit"
    with pytest.raises(NotFound):
        client.evaluations.calls(run.id, 3)  # the run has 3 rows
    with Client(api_address[0], create_key(api_address[2], "--project", "p-other")) as stranger, pytest.raises(NotFound):
        stranger.evaluations.calls(run.id, 1)


async def test_async_agents_run_too(names: dict[str, Any]) -> None:
    async def my_agent(question: str) -> str:
        return "fine [[rating@quality-model=6]] [[rating@safety-model=6]]"

    run = names["client"].evaluations.run(dataset_id=names["dataset"].id,
                                          subject={"kind": "custom_agent", "displayName": "a"},
                                          scorer_group_id=_group(names).id)
    assert run.execute(my_agent).finalize().rating == pytest.approx(6.0)


def test_the_group_wins_and_additional_scorers_are_nulled_with_a_warning(
        names: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    client, group = names["client"], _group(names)
    pending = client.evaluations.run(dataset_id=names["dataset"].id,
                                     subject={"kind": "custom_agent", "displayName": "a"},
                                     scorer_group_id=group.id, scorer_id=names["quality"].id,
                                     additional_scorer_ids=[names["pii"].id])
    assert pending.run.scorer_id is None and pending.run.additional_scorer_ids is None
    assert pending.warnings == [
        f"scorer_id {names['quality'].id!r} ignored: scorer_group_id and scorer_id are mutually exclusive "
        "and the group wins",
        f"additional_scorer_ids nulled ({names['pii'].id} not graded): the group wins, and a run graded by "
        "group 'Release quality bar' is graded by the group alone"]
    assert "warning: additional_scorer_ids nulled" in capsys.readouterr().err, "the SDK says so"
    single = client.evaluations.run(dataset_id=names["dataset"].id,
                                    subject={"kind": "custom_agent", "displayName": "a"},
                                    scorer_id=names["quality"].id, additional_scorer_ids=[names["safety"].id])
    assert single.run.additional_scorer_ids == [names["safety"].id] and single.warnings == []
    graded = single.execute(agent_rating(quality=7, safety=2)).finalize()
    assert graded.rating == pytest.approx(7.0), "additional scorers are graded alongside, not in the rating"
    assert graded.judge_scorer_results[0][1]["label"] == "Safety" and graded.judge_scorer_results[0][1]["rating"] == 2
    # No group graded it: no "(group)", no groupName - the scorer's name, and the others' lines.
    assert (graded.run.group_name, graded.run.scorer_name) == (None, "Quality")
    assert graded.breakdown == ["Quality: 7.00 (3 of 3 rows scored)", "Safety: 2.00"]
    with pytest.raises(GateFailed, match=r"gate failed: scorer 'Quality' score is 7.00, under 8 by 1.00"):
        graded.gate(fail_under=8)


def test_a_gate_on_a_name_that_is_no_judge_member_is_a_configuration_error(names: dict[str, Any]) -> None:
    client, group = names["client"], _group(names)
    run = client.evaluations.run(dataset_id=names["dataset"].id, subject={"kind": "custom_agent", "displayName": "a"},
                                 scorer_group_id=group.id).execute(agent_rating(quality=8, safety=9)).finalize()
    for name in ("PII", "Qualty"):  # a pattern member, a typo
        with pytest.raises(NotAJudgeMember, match=r"judge members: 'Quality', 'Safety'") as info:
            run.gate(fail_under=8, scorer=name)
        assert not isinstance(info.value, GateFailed), "CI must not read it as a quality failure"


def test_runs_and_datasets_are_the_projects_own(names: dict[str, Any], api_address: tuple[str, str, str]) -> None:
    run = names["client"].evaluations.run(dataset_id=names["dataset"].id,
                                          subject={"kind": "custom_agent", "displayName": "a"},
                                          scorer_group_id=_group(names).id)
    with Client(api_address[0], create_key(api_address[2], "--project", "p-other")) as stranger:
        with pytest.raises(NotFound):
            stranger.datasets.get(names["dataset"].id)
        with pytest.raises(NotFound):
            stranger.evaluations.get(run.id)
        with pytest.raises(NotFound):
            stranger.evaluations.run(dataset_id=names["dataset"].id,
                                     subject={"kind": "custom_agent", "displayName": "a"},
                                     scorer_group_id=_group(names).id)


def test_what_grades_a_run_is_refused_by_the_errors_kind(names: dict[str, Any], api_address: tuple[str, str, str]) -> None:
    # Chosen by the error's type (NotFound 404, InvalidDocument 400), whatever its message says.
    headers = {"Authorization": f"Bearer {api_address[1]}"}
    base = {"datasetId": names["dataset"].id, "subject": {"kind": "custom_agent", "displayName": "a"}}
    for body, status in (({}, 400), ({"scorerId": "nope"}, 404), ({"scorerGroupId": "nope"}, 404)):
        answer = httpx.post(f"{api_address[0]}/v1/evaluations", headers=headers, json={**base, **body})
        assert answer.status_code == status, (body, answer.text)


def test_a_finalize_must_answer_every_row_once(names: dict[str, Any], api_address: tuple[str, str, str]) -> None:
    client = names["client"]
    pending = client.evaluations.run(dataset_id=names["dataset"].id,
                                     subject={"kind": "custom_agent", "displayName": "a"},
                                     scorer_group_id=_group(names).id)
    answer = httpx.post(f"{api_address[0]}/v1/evaluations/{pending.id}/finalize",
                        headers={"Authorization": f"Bearer {api_address[1]}"},
                        json={"outputs": [{"row": 0, "output": "x"}, {"row": 0, "output": "y"}]})
    assert answer.status_code == 400
    assert [e["message"] for e in answer.json()["errors"]] == ["row 0 is answered twice",
                                                               "rows 1, 2 have no output or error"]


def sandboxes_of(pid: int) -> set[int]:
    """The sandbox processes (bubblewrap) a process started and still runs."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return {int(c) for c in children if Path(f"/proc/{c}/comm").read_text().strip() == "bwrap"}


def test_every_run_is_graded_by_the_api_process_one_engine(api_process: tuple[ApiProcess, str, str],
                                                           names: dict[str, Any]) -> None:
    # One engine per process, built at start: its sandbox pool serves every finalize request
    # (no pool, judge client or processes of its own per request, outside the process's bounds).
    process, client = api_process[0], names["client"]
    assert process.proc is not None
    warm = sandboxes_of(process.proc.pid)
    assert len(warm) == 2, "the pool (SGW_CODE_SANDBOXES) started with the process"
    length = client.monitor.customs.create(name="Length", type="code",
                                           code="def score(i, o, e, s, m):\n    return min(1.0, len(o) / 100)\n")
    group = client.monitor.scorer_groups.create(
        "Length only", members=[{"kind": "custom", "refId": length.id, "weight": 1, "gate": False}])
    for _ in range(2):
        run = client.evaluations.run(dataset_id=names["dataset"].id, subject={"kind": "custom_agent", "displayName": "a"},
                                     scorer_group_id=group.id).execute(lambda question: "x" * 50).finalize()
        assert [r["rating"] for r in run.rows] == [5.0] * 3  # the code scorer ran
        assert sandboxes_of(process.proc.pid) == warm, "the same sandbox processes graded it"


def _group(names: dict[str, Any]) -> Any:
    client = names["client"]
    found = [g for g in client.monitor.scorer_groups.list() if g.name == "Release quality bar"]
    if found:
        return found[0]
    return client.monitor.scorer_groups.create("Release quality bar", members=[
        {"kind": "judge", "refId": names["quality"].id, "weight": 1, "gate": False},
        {"kind": "judge", "refId": names["safety"].id, "weight": 1, "gate": True},
        {"kind": "pattern", "refId": names["pii"].id, "weight": 0, "gate": True}])


async def test_the_async_twin_runs_and_gates_alike(names: dict[str, Any], api_address: tuple[str, str, str]) -> None:
    from scorer_groups import AsyncClient

    group = _group(names)
    async with AsyncClient(api_address[0], api_address[1]) as client:
        dataset = await client.datasets.create("Async questions", rows=[{"input": "a"}, {"input": "b"}])
        pending = await client.evaluations.run(dataset_id=dataset.id, scorer_group_id=group.id,
                                               subject={"kind": "custom_agent", "displayName": "a"})
        run = await (await pending.execute(agent_rating(quality=9, safety=4))).finalize()
        assert [r["rating"] for r in run.rows] == [0.0, 0.0], "Safety under 5 zeroes the group (must pass)"
        with pytest.raises(GateFailed, match=r"group 'Release quality bar' score is 0.00, under 7 by 7.00"):
            run.gate(fail_under=7)
        assert (await client.evaluations.get(run.id)).rows == run.rows


def test_a_run_is_graded_once(names: dict[str, Any], api_address: tuple[str, str, str]) -> None:
    from adapters.stores import keys

    client = names["client"]
    pending = client.evaluations.run(dataset_id=names["dataset"].id, scorer_group_id=_group(names).id,
                                     subject={"kind": "custom_agent", "displayName": "a"})
    outputs = {"outputs": [{"row": i, "output": "x"} for i in range(3)]}
    finalize = f"{api_address[0]}/v1/evaluations/{pending.id}/finalize"
    auth = {"Authorization": f"Bearer {api_address[1]}"}
    claim = keys.evaluation("p-eval", pending.id) + ":finalizing"
    connect_sync(api_address[2]).set(claim, b"1")  # another request is grading it right now
    busy = httpx.post(finalize, headers=auth, json=outputs)
    assert busy.status_code == 409 and "being finalized by another request" in busy.json()["detail"]
    connect_sync(api_address[2]).delete(claim)
    assert httpx.post(finalize, headers=auth, json=outputs, timeout=60).status_code == 200
    again = httpx.post(finalize, headers=auth, json=outputs, timeout=60)
    assert again.status_code == 400 and again.json()["errors"][0]["message"] == "the run is already finalized"


LABELLED = [{"input": "q0", "humanRating": 9}, {"input": "q1", "humanRating": 2}, {"input": "q2", "humanRating": 8},
            {"input": "q3", "humanRating": 3}, {"input": "q4", "humanRating": 7}, {"input": "q5", "humanPass": False},
            {"input": "q6"}]
QUALITY_SAYS = {"q0": 8, "q1": 3, "q2": 9, "q3": 5, "q4": 7, "q5": 8, "q6": 4}


def test_a_run_over_rows_people_labelled_reports_its_agreement_with_them(names: dict[str, Any],
                                                                          api_address: tuple[str, str, str]) -> None:
    stats = pytest.importorskip("scipy.stats")
    client = names["client"]
    dataset = client.datasets.create("Labelled", rows=LABELLED)
    group = client.monitor.scorer_groups.create(
        "Calibrated", members=[{"kind": "judge", "refId": names["quality"].id, "weight": 1, "gate": False}],
        online={"enabled": False, "sampleRate": 1, "alertThreshold": 6, "severity": "high"})
    run = client.evaluations.run(dataset_id=dataset.id, subject={"kind": "custom_agent", "displayName": "a"},
                                 scorer_group_id=group.id).execute(
        lambda q: f"answer [[rating@quality-model={QUALITY_SAYS[q]}]]").finalize()
    agreement = run.agreement
    assert agreement is not None and (agreement.labelled_rows, agreement.human_ratings) == (6, 5), "q6 has no label"
    quality = agreement.column("Quality")
    assert agreement.group.label == "Calibrated" and quality.kind == "judge" and quality.scorer_id == names["quality"].id
    machine, people = [8, 3, 9, 5, 7], [9, 2, 8, 3, 7]
    for column in (agreement.group, quality):  # one judge, weight 1: the group's score is its rating
        assert column.labelled_rows == 6 and column.unscored_labelled_rows == 0
        assert column.spearman == pytest.approx(stats.spearmanr(machine, people).statistic, abs=1e-4)
        assert column.mean_absolute_error == pytest.approx(sum(abs(m - p) for m, p in zip(machine, people, strict=True)) / 5)
        gate, alert = column.marks
        assert (gate.threshold, alert.mark, alert.threshold) == (5.0, "alertThreshold", 6.0)
        # At 6: machine passes q0 q2 q4 q5, people q0 q2 q4 - q5 (humanPass false) is the one miss.
        assert (alert.confusion.both_pass, alert.confusion.machine_pass_people_fail,
                alert.confusion.machine_fail_people_pass, alert.confusion.both_fail) == (3, 1, 0, 2)
        assert column.suggested_threshold is not None and column.suggested_threshold.sure == "a hint"
        assert [(d.row, d.gap) for d in column.disagreements][:2] == [(5, 3.0), (3, 2.0)]
    assert client.evaluations.get(run.id).agreement == agreement, "kept with the run"
    unlabelled = client.evaluations.run(dataset_id=names["dataset"].id, subject={"kind": "custom_agent", "displayName": "a"},
                                        scorer_group_id=group.id).execute(agent_rating(quality=8, safety=9)).finalize()
    assert unlabelled.agreement is None
    raw = httpx.get(f"{api_address[0]}/v1/evaluations/{unlabelled.id}", headers={"Authorization": f"Bearer {api_address[1]}"}).json()
    assert "agreement" not in raw, "absent, not null: a 0.2 SDK reads the run"


def test_human_verdicts_come_in_csv_too_and_a_malformed_one_is_refused_by_name(
        names: dict[str, Any], api_address: tuple[str, str, str], tmp_path: Path) -> None:
    client = names["client"]
    path = tmp_path / "labelled.csv"
    path.write_text("input,humanRating,humanPass,lang\nq0,9,,en\nq1,,fail,fr\nq2,,,de\n")
    dataset = client.datasets.create("Labelled CSV", path=path)
    _, items = client.datasets.rows(dataset.id)
    assert [(i.human_rating, i.human_pass, i.metadata) for i in items] == [
        (9.0, None, {"lang": "en"}), (None, False, {"lang": "fr"}), (None, None, {"lang": "de"})]
    headers = {"Authorization": f"Bearer {api_address[1]}"}
    for row, field in (({"input": "x", "humanRating": 11}, "humanRating"), ({"input": "x", "humanPass": "yes"}, "humanPass")):
        answer = httpx.post(f"{api_address[0]}/v1/datasets", headers=headers,
                            json={"name": "bad", "format": "jsonl", "content": json.dumps(row)})
        assert answer.status_code == 400 and field in answer.text, answer.text
    path.write_text("input,humanRating\nq0,nine\n")
    answer = httpx.post(f"{api_address[0]}/v1/datasets", headers=headers,
                        json={"name": "bad", "content": path.read_text(), "format": "csv"})
    assert answer.status_code == 400 and "line 2: humanRating: must be a number" in answer.text, answer.text


def test_a_dataset_runs_rows_enter_the_review_queues_that_take_dataset_results(names: dict[str, Any]) -> None:
    """A queue with origin ``dataset`` takes a finalized run's rows as its rule says; a
    queue of live traffic only takes none of them."""
    client = names["client"]
    group = client.monitor.scorer_groups.create("Reviewed release bar", members=[
        {"kind": "judge", "refId": names["quality"].id, "weight": 1, "gate": False}],
        online={"enabled": False, "sampleRate": 1.0, "alertThreshold": 6, "severity": "low"})
    runs = client.monitor.review_queues.create("Runs below", [group.id], {"below": True}, origins=["dataset"])
    live = client.monitor.review_queues.create("Live below", [group.id], {"below": True})
    run = client.evaluations.run(dataset_id=names["dataset"].id, subject={"kind": "custom_agent", "displayName": "a"},
                                 scorer_group_id=group.id).execute(agent_rating(quality=2, safety=9)).finalize()
    assert run.rating == pytest.approx(2.0)
    items = client.monitor.review_queues.items(runs.id).items
    assert len(items) == 3 and {(i.origin, i.reason, i.subject.scope) for i in items} == {("dataset", "below", "dataset")}
    assert {i.rating.run_id for i in items} == {run.id}
    assert items[0].subject.output.startswith("An answer to")
    assert client.monitor.review_queues.items(live.id).items == []
    assert client.monitor.review_queues.items(runs.id).counts.taken == 3


def test_a_run_repeated_against_unchanged_judges_calls_none_and_reserves_nothing(
        names: dict[str, Any], judge: JudgeServer, api_address: tuple[str, str, str]) -> None:
    from adapters.stores import keys
    from scoring.routing import DEFAULT_BUDGET_WINDOW_S

    client = names["client"]
    group = client.monitor.scorer_groups.create("Repeated", members=[
        {"kind": "judge", "refId": names["quality"].id, "weight": 1},
        {"kind": "judge", "refId": names["safety"].id, "weight": 1}])

    def reserved_now() -> int:  # the project's calls of this window (counted without a budget too)
        start = int(time.time()) // DEFAULT_BUDGET_WINDOW_S * DEFAULT_BUDGET_WINDOW_S
        return int(connect_sync(api_address[2]).get(keys.judge_budget("p-eval", start)) or 0)

    def run_once() -> tuple[Any, int, int]:
        calls, used = len(judge.requests), reserved_now()
        run = client.evaluations.run(dataset_id=names["dataset"].id, scorer_group_id=group.id,
                                     subject={"kind": "custom_agent", "displayName": "same"}
                                     ).execute(agent_rating(quality=6, safety=9)).finalize()
        return run, len(judge.requests) - calls, reserved_now() - used

    first, called, reserved = run_once()
    assert (called, reserved) == (6, 6), "3 rows x 2 judges, asked and reserved"
    start = int(time.time()) // DEFAULT_BUDGET_WINDOW_S * DEFAULT_BUDGET_WINDOW_S
    saved_before = int(connect_sync(api_address[2]).hget(keys.judge_saved("p-eval", start), "calls") or 0)
    again, called, reserved = run_once()
    assert (called, reserved) == (0, 0), "the same outputs to unchanged judges: paid for already"
    saved = int(connect_sync(api_address[2]).hget(keys.judge_saved("p-eval", start), "calls") or 0) - saved_before
    assert saved == 6, "the window counts the calls the cache saved"
    assert again.rating == first.rating == pytest.approx(7.5)
    assert again.judge_scorer_results == first.judge_scorer_results
    # What the judges cost, with no price in the API process: the first run's calls unknown (never
    # 0); the second made none - known to have cost nothing.
    assert (first.spend.judge_calls, first.spend.unpriced_calls, first.spend.cost) == (6, 6, None)
    assert first.spend.tokens > 0
    assert (again.spend.judge_calls, again.spend.tokens, again.spend.cost) == (0, 0, 0.0)
    calls = len(judge.requests)
    fresh = client.evaluations.run(dataset_id=names["dataset"].id, scorer_group_id=group.id, cache=False,
                                   subject={"kind": "custom_agent", "displayName": "same"}
                                   ).execute(agent_rating(quality=6, safety=9)).finalize()
    assert len(judge.requests) - calls == 6 and fresh.rating == first.rating, "cache=False: every judge asked"
