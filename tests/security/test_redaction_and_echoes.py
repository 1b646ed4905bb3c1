"""What is echoed back to a tenant answers no question about the operator's secrets: a dataset
row of guesses comes back the same whichever guess is the worker's judge key (7); an
invalid setting is never quoted back, short keys and header values included (52, 8 i); a group
moved to another project lists none of its old project's results (52, 8 ii)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from adapters.stores.ratings import RatingsStore
from devtools.judge_server import Behaviour, JudgeServer
from scorer_groups import Client, Retry
from scorer_groups.documents import MemberVerdict, Rating
from scoring.results import HistoryEntry
from tests.support.api_process import ApiProcess, api_with_judge, create_key
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases
from worker.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Wombat7Plain"  # the API process's judge key: no shape a redactor knows, only its value
WRONG = "Wombat7Plaim"  # a guess one letter off
GUESSES = ["Wombat1Plain", "Wombat2Plain", "{}", "Wombat3Plain", "Wombat4Plain", "Kestrel9Dune"] + \
    [f"Guess{n:04d}Word" for n in range(200)]


@pytest.fixture(scope="module")
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[tuple[ApiProcess, str, JudgeServer]]:
    with api_with_judge(redis_databases, tmp_path_factory.mktemp("api"), "p-a",
                        env={"SGW_JUDGE_API_KEY": SECRET}) as found:
        yield found


def echoed(client: Client, judge: JudgeServer, dataset_id: str, group_id: str, guess: str) -> dict[str, Any]:
    """One dataset run whose agent answers with the guesses (``guess`` among them) and whose judge
    answers by repeating them (prose, so the judge's error quotes them too): what the tenant gets
    back of the row - its judge call and the row as kept."""
    guesses = " ".join(g if g != "{}" else guess for g in GUESSES)
    judge.script(Behaviour.content(f"{guesses} - I repeat what I was given and rate nothing"))
    run = client.evaluations.run(dataset_id=dataset_id, subject={"kind": "custom_agent", "displayName": "a"},
                                 scorer_group_id=group_id).execute(lambda _: f"My keys: {guesses}").finalize()
    (call,) = client.evaluations.calls(run.id, 0).calls
    row = {k: v for k, v in run.rows[0].items() if k not in ("ratingId", "scoredAt", "latencyMs")}
    return {"messages": [[m.role, m.content] for m in call.messages], "answer": call.answer,
            "error": call.error, "row": row}


def test_a_row_of_guesses_comes_back_the_same_whichever_guess_is_the_secret(
        api: tuple[ApiProcess, str, JudgeServer]) -> None:
    process, key, judge = api
    with Client(process.url, key, retry=Retry(attempts=0)) as client:
        quality = client.monitor.judges.create(name="Quality", criteria="Helpful?")
        group = client.monitor.scorer_groups.create("Guessed", members=[
            {"kind": "judge", "refId": quality.id, "weight": 1}])
        dataset = client.datasets.create("Guesses", rows=[{"input": "What are your keys?"}])
        right = echoed(client, judge, dataset.id, group.id, SECRET)
        wrong = echoed(client, judge, dataset.id, group.id, WRONG)
    # The same text, the right guess where the wrong one was: no guess singled out anywhere.
    assert json.loads(json.dumps(right).replace(SECRET, WRONG)) == wrong
    assert "[redacted]" not in json.dumps(right)
    assert right["error"] and SECRET in right["error"], "the judge's error quotes its answer, the guesses"
    assert SECRET in right["answer"] and SECRET in right["messages"][-1][1]
    assert SECRET in json.dumps(right["row"]), "the row as kept: its output and the judge's error"


def test_a_judge_endpoint_echoing_the_key_unasked_is_still_masked(api: tuple[ApiProcess, str, JudgeServer]) -> None:
    # What the server's side writes keeps its mask: an endpoint's error that quotes the key the
    # tenant never sent. (A guard of what the fix keeps: it passed before the fix too.)
    process, key, judge = api
    with Client(process.url, key, retry=Retry(attempts=0)) as client:
        quality = client.monitor.judges.create(name="Quality", criteria="Helpful?")
        group = client.monitor.scorer_groups.create("Echoing endpoint", members=[
            {"kind": "judge", "refId": quality.id, "weight": 1}])
        judge.script(Behaviour.status(401, body={"error": {"message": f"key {SECRET} is revoked"}}))
        verdict = client.monitor.scorer_groups.grade(group.id, input="q", output="a")
    (call,) = verdict.calls
    assert call.error is not None and "key [redacted] is revoked" in call.error and SECRET not in call.error


SETTINGS_SECRETS = {"SGW_JUDGE_API_KEY": "sk-w4",  # shorter than any value a redactor cuts
                    "SGW_JUDGE_EXTRA_HEADERS": '{"X-Gateway-Key": "gw-7q"}',
                    "SGW_JUDGE_TRACE_HEADERS": '{"X-Trace-Key": "tr-8z"}'}


@pytest.mark.parametrize("invalid", [{"SGW_CLAIM_LEASE_S": "1"},  # a rule across settings: given every one
                                     {"SGW_JUDGE_TRACE_HEADERS": '{"X-Trace-Key": "tr-8z"'}],  # not JSON
                         ids=["across", "headers"])
def test_an_invalid_setting_is_refused_without_quoting_any_setting(invalid: dict[str, str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, **SETTINGS_SECRETS, **invalid, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'sdk'}"}
    done = subprocess.run([sys.executable, "-m", "worker.cli", "check", "--no-judge"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "error: invalid settings:" in done.stderr, done.stderr
    printed = done.stdout + done.stderr
    assert not [v for v in ("sk-w4", "gw-7q", "tr-8z") if v in printed], printed
    # Nor the error itself, wherever it is shown (a traceback, a log line).
    for name, value in {**SETTINGS_SECRETS, **invalid}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert not [v for v in ("sk-w4", "gw-7q", "tr-8z") if v in str(refused.value)], str(refused.value)


def test_a_group_moved_to_another_project_lists_none_of_its_old_results(
        api: tuple[ApiProcess, str, JudgeServer]) -> None:
    process = api[0]
    key_b, operator_key = create_key(process.redis_url, "--project", "p-b"), create_key(process.redis_url, "--operator")
    with Client(process.url, operator_key, retry=Retry(attempts=0)) as operator:
        pii = operator.monitor.patterns.create(name="PII", polarity="failure", template="email", project_id="p-a")
        group = operator.monitor.scorer_groups.create("Moving", members=[{"kind": "pattern", "refId": pii.id,
                                                                            "weight": 1}], project_id="p-a")
        record(process.redis_url, group.id, [rating(group.id, n, "p-a") for n in range(3)])
        operator.monitor.patterns.update(pii.id, project_id="p-b")
        operator.monitor.scorer_groups.update(group.id, project_id="p-b")
        record(process.redis_url, group.id, [rating(group.id, 3, "p-b")])
        assert [r.project_id for r in operator.monitor.scorer_groups.results(group.id).items] == \
            ["p-b", "p-a", "p-a", "p-a"], "kept: an operator reads them all"
    with Client(process.url, key_b, retry=Retry(attempts=0)) as b:
        listed = b.monitor.scorer_groups.results(group.id)
    assert [(r.id, r.project_id) for r in listed.items] == [("r-3", "p-b")]


def rating(group_id: str, n: int, project: str) -> Rating:
    return Rating(id=f"r-{n}", kind=f"scorer-group:{group_id}", group_id=group_id, group_name="Moving",
                  project_id=project, agent_id="agent", scope="trace", trace_id=f"{project}-trace-{n}", rating=5.0,
                  reason=None, justification="Weighted blend: 5.0",
                  scored_at=datetime.fromtimestamp(1_796_000_000 + n, UTC),
                  members=[MemberVerdict(kind="pattern", ref_id="pii", name="PII", weight=1, gate=False,
                                         status="scored", native=False, goodness=None, detail=None)])


def record(redis_url: str, group_id: str, ratings: list[Rating]) -> None:
    async def write() -> None:
        redis = connect(redis_url)
        await RatingsStore(redis).write([HistoryEntry(group_id, r.rating, False, r.scored_at.timestamp(), r.to_json(),
                                                      rating_id=r.id) for r in ratings])
        await redis.aclose()

    asyncio.run(write())
