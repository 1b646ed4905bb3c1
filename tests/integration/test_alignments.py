"""Alignment runs and promotion on the real API process, Redis and the local judge
(``devtools.judge_server``, which learns from a judge's examples: a case sharing an example's
``[[case=C]]`` marker gets that example's rating). People rate four kinds of case 1, 4, 7 and 10;
the current judge reads each case's own ``[[rating=N]]`` marker, 3 points off people's. A candidate
whose examples teach the four kinds agrees measurably better on the held-out cases: the run says
so, with both judges' figures; promote makes it the judge. A candidate taught backwards is
refused unless forced; an example made from a case never grades that case; a run of another
project's judge is not found."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from adapters.stores.review_items import ReviewItems
from scorer_groups import Client
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.review_rules import review_item_id
from tests.support.api_process import ApiProcess, api_with_judge, create_key
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

KINDS = {"billing": 1.0, "login": 4.0, "shipping": 7.0, "refund": 10.0}
ROWS = 48


@pytest.fixture(scope="module")
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str]]:
    with api_with_judge(redis_databases, tmp_path_factory.mktemp("api"), "p-align",
                        env={"SGW_JUDGE_TIMEOUT_S": "5"}) as (process, key, _judge):
        yield process, key


def rows() -> list[dict[str, Any]]:
    made = []
    for n in range(ROWS):
        kind = list(KINDS)[n % 4]
        people = KINDS[kind]
        judged = min(10.0, max(0.0, people + (3 if n % 8 < 4 else -3)))  # the current judge: near, not on
        made.append({"input": f"question {n} about {kind}", "humanRating": people,
                     "output": f"answer {n} [[case={kind}]] [[rating={judged:g}]]"})
    return made


def taught(ratings: dict[str, float]) -> list[dict[str, Any]]:
    return [{"id": f"ex-{kind}", "input": f"a {kind} question", "output": f"an example [[case={kind}]]",
             "rating": rating} for kind, rating in ratings.items()]


def setup(process: ApiProcess, key: str) -> tuple[str, str]:
    with process.client(key) as http:
        judge = http.post("/v1/judges", json={"name": "Helpful", "criteria": "Helpful?"}).json()["id"]
        content = "\n".join(orjson.dumps(r).decode() for r in rows())
        dataset = http.post("/v1/datasets", json={"name": "Labelled", "content": content})
        assert dataset.status_code == 201, dataset.text
        return judge, dataset.json()["id"]


def run(process: ApiProcess, key: str, judge: str, body: dict[str, Any]) -> dict[str, Any]:
    with process.client(key) as http:
        started = http.post(f"/v1/judges/{judge}/alignments", json=body)
        assert started.status_code == 202, started.text
        location = started.headers["Location"]
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            read = http.get(location).json()
            if read["state"] != "running":
                assert read["state"] == "done", read
                return dict(read)
            time.sleep(0.2)
    raise AssertionError("the alignment run never finished")


def test_a_candidate_that_agrees_better_on_held_out_labels_is_promoted(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    judge, dataset = setup(process, key)
    own = {"id": "ex-row0", "input": "question 0 about billing", "output": rows()[0]["output"], "rating": 1,
           "source": f"{dataset}:1:0"}  # made from a case: that case is never graded by the candidate
    done = run(process, key, judge, {"dataset": dataset, "candidate": {"examples": [*taught(KINDS), own]}})

    counts = done["counts"]
    assert counts["labelled"] == ROWS and counts["heldOutAsExamples"] == 1
    assert counts["tune"] + counts["evaluated"] == ROWS - 1 and counts["evaluated"] >= 20
    assert f"{dataset}:1:0" not in done["tuneCaseIds"]
    current, candidate = done["current"], done["candidateFigures"]
    assert current["cases"] == candidate["cases"] == counts["evaluated"] - counts["budgetSkipped"]
    assert current["spearman"]["value"] < 0.95 and candidate["spearman"]["value"] == pytest.approx(1.0)
    assert candidate["spearman"]["low"] <= candidate["spearman"]["value"] <= candidate["spearman"]["high"]
    assert candidate["meanAbsoluteError"]["value"] == 0 < current["meanAbsoluteError"]["value"]
    assert done["better"] is True and done["changed"], "every verdict moved"
    assert done["total"] == done["done"] == 2 * counts["evaluated"]

    with process.client(key) as http:
        promoted = http.post(f"/v1/judges/{judge}/promote", json={"alignment": done["id"]})
        assert promoted.status_code == 200, promoted.text
        assert [e["id"] for e in promoted.json()["examples"]] == ["ex-billing", "ex-login", "ex-shipping",
                                                                  "ex-refund", "ex-row0"]
        read = http.get(f"/v1/judges/{judge}/alignments/{done['id']}").json()
        assert read["promotedAt"] is not None and read["promotedBy"]
        again = http.post(f"/v1/judges/{judge}/promote", json={"alignment": done["id"]})
        assert again.status_code == 409, again.text
        assert [a["id"] for a in http.get(f"/v1/judges/{judge}/alignments").json()] == [done["id"]]


def test_an_example_written_by_hand_holds_out_the_case_with_its_output(api: tuple[ApiProcess, str]) -> None:
    """No ``source``: an example whose output is a labelled case's still holds that case out of
    the candidate's grading, and is counted."""
    process, key = api
    judge, dataset = setup(process, key)
    by_hand = {"id": "ex-hand", "input": "a question I wrote", "output": rows()[5]["output"], "rating": 4}
    done = run(process, key, judge, {"dataset": dataset, "candidate": {"examples": [*taught(KINDS), by_hand]}})
    assert done["counts"]["heldOutAsExamples"] == 1
    assert done["counts"]["tune"] + done["counts"]["evaluated"] == ROWS - 1
    assert f"{dataset}:1:5" not in done["tuneCaseIds"]
    assert all(c["caseId"] != f"{dataset}:1:5" for c in done["changed"]), "never graded by the candidate"


def test_a_candidate_that_agrees_worse_is_refused_unless_forced(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    judge, dataset = setup(process, key)
    backwards = {kind: 10 - rating for kind, rating in KINDS.items()}  # ranks every case against people
    done = run(process, key, judge, {"dataset": dataset, "candidate": {"examples": taught(backwards),
                                                                       "criteria": "Unhelpful?"}})
    assert done["better"] is False
    with process.client(key) as http:
        refused = http.post(f"/v1/judges/{judge}/promote", json={"alignment": done["id"]})
        assert refused.status_code == 409 and "agreed worse" in refused.text, refused.text
        assert http.get(f"/v1/judges/{judge}").json()["criteria"] == "Helpful?", "nothing changed"
        forced = http.post(f"/v1/judges/{judge}/promote", json={"alignment": done["id"], "force": True})
        assert forced.status_code == 200 and forced.json()["criteria"] == "Unhelpful?"


def test_another_project_cannot_run_or_read_a_judges_alignments(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    judge, dataset = setup(process, key)
    other = create_key(process.redis_url, "--project", "p-align-other")
    with process.client(other) as http:
        body = {"dataset": dataset, "candidate": {"criteria": "x"}}
        assert http.post(f"/v1/judges/{judge}/alignments", json=body).status_code == 404
        assert http.get(f"/v1/judges/{judge}/alignments").status_code == 404
        mine = http.post("/v1/judges", json={"name": "Theirs", "criteria": "?"}).json()["id"]
        # Their own judge, measured on this project's dataset: the dataset is not theirs.
        assert http.post(f"/v1/judges/{mine}/alignments", json=body).status_code == 404
    with process.client(key) as http:
        both = http.post(f"/v1/judges/{judge}/alignments", json={"dataset": dataset, "queue": "q", "candidate": {}})
        assert both.status_code == 400 and "dataset or queue" in both.text, both.text


def test_the_sdk_runs_an_alignment_and_promotes_it(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    judge, dataset = setup(process, key)
    with Client(process.url, key) as client:
        started = client.monitor.judges.align(judge, candidate={"examples": taught(KINDS)}, dataset=dataset)
        deadline = time.monotonic() + 90
        while (run_ := client.monitor.judges.alignment(judge, started.id)).state == "running":
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert run_.state == "done" and run_.better is True
        assert [a.id for a in client.monitor.judges.alignments(judge)] == [started.id]
        promoted = client.monitor.judges.promote(judge, started.id)
        assert [e.id for e in promoted.examples] == [e["id"] for e in taught(KINDS)]
        assert [e.id for e in client.monitor.judges.examples(judge)] == [e.id for e in promoted.examples]


def test_a_shadow_runs_the_candidate_beside_each_live_group_until_promoted(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    judge, dataset = setup(process, key)
    with process.client(key) as http:
        live = http.post("/v1/scorer-groups", json={
            "name": "Support", "members": [{"kind": "judge", "refId": judge}],
            "online": {"enabled": True, "sampleRate": 0.25, "sampleSalt": "s1", "alertThreshold": 6,
                       "severity": "high", "alertMode": "window"}}).json()["id"]
        none_live = http.post("/v1/scorer-groups", json={"name": "Off", "members": [{"kind": "judge", "refId": judge}],
                                                         "online": {"enabled": False, "sampleRate": 1,
                                                                    "alertThreshold": 6, "severity": "high"}})
        assert none_live.status_code == 201
    done = run(process, key, judge, {"dataset": dataset, "candidate": {"examples": taught(KINDS)}, "shadowHours": 2})
    (shadow,) = done["shadows"]
    assert shadow["groupId"] == live and done["shadowUntil"] is not None
    with process.client(key) as http:
        copy = http.get(f"/v1/scorer-groups/{shadow['shadowId']}").json()
        online = copy["online"]
        assert (online["shadowOf"], online["sampleRate"], online["sampleSalt"]) == (live, 0.25, "s1"), "the same sample"
        assert "alertMode" not in online, "a shadow pages no one"
        (member,) = copy["members"]
        candidate = http.get(f"/v1/judges/{member['refId']}").json()
        assert member["refId"] != judge and [e["id"] for e in candidate["examples"]] == [e["id"] for e in taught(KINDS)]
        assert http.post(f"/v1/judges/{judge}/promote", json={"alignment": done["id"]}).status_code == 200
        assert http.get(f"/v1/scorer-groups/{shadow['shadowId']}").status_code == 404, "promoted: the shadow goes"
        assert http.get(f"/v1/judges/{member['refId']}").status_code == 404
        assert http.get(f"/v1/judges/{judge}/alignments/{done['id']}").json()["shadows"] == []

        stopped = run(process, key, judge, {"dataset": dataset, "candidate": {"criteria": "x"}, "shadowHours": 1})
        (shadow,) = stopped["shadows"]
        assert http.delete(f"/v1/judges/{judge}/alignments/{stopped['id']}/shadow").status_code == 204
        assert http.get(f"/v1/scorer-groups/{shadow['shadowId']}").status_code == 404
        lonely = a_lonely_judge(http)
        refused = http.post(f"/v1/judges/{lonely}/alignments", json={"dataset": dataset, "candidate": {},
                                                                     "shadowHours": 1})
        assert refused.status_code == 400 and "shadowHours" in refused.text, refused.text


def a_lonely_judge(http: Any) -> str:
    return str(http.post("/v1/judges", json={"name": "Alone", "criteria": "?"}).json()["id"])


def test_a_review_queues_labels_measure_a_candidate(api: tuple[ApiProcess, str]) -> None:
    """The labels people gave in a review queue (the median of each item's reviewers) are cases too."""
    process, key = api
    judge, _ = setup(process, key)
    with process.client(key) as http:
        group = http.post("/v1/scorer-groups", json={"name": "G", "members": [{"kind": "judge", "refId": judge}],
                                                     "online": {"enabled": False, "sampleRate": 1,
                                                                "alertThreshold": 6, "severity": "high"}}).json()["id"]
        queue = ReviewQueue.model_validate(http.post("/v1/review-queues", json={
            "name": "Q", "groupIds": [group], "rule": {"below": True}}).json())
    made = rows()
    items = [ReviewItem.model_validate({
        "id": review_item_id(queue.id, f"r-{n}"), "queueId": queue.id, "projectId": "p-align", "groupId": group,
        "ratingId": f"r-{n}", "reason": "below", "origin": "live", "createdAt": datetime.now(UTC).isoformat(),
        "subject": {"scope": "trace", "traceId": f"t{n}", "input": row["input"], "output": row["output"]},
        "rating": {"id": f"r-{n}", "groupId": group, "groupName": "G", "projectId": "p-align", "agentId": "a",
                   "scope": "trace", "traceId": f"t{n}", "kind": "k", "rating": 3.0, "reason": None,
                   "justification": "j", "scoredAt": datetime.now(UTC).isoformat(), "members": []}})
        for n, row in enumerate(made)]
    asyncio.run(_take(process.redis_url, queue, items))
    ann = create_key(process.redis_url, "--project", "p-align", "--role", "reviewer", "--name", "ann")
    with process.client(ann) as http:
        for item, row in zip(items, made, strict=True):
            assert http.post(f"/v1/review-queues/{queue.id}/next").json()["item"]["id"] == item.id
            assert http.put(f"/v1/review-items/{item.id}/labels/me", json={"rating": row["humanRating"]}).status_code == 200
    done = run(process, key, judge, {"queue": queue.id, "candidate": {"examples": taught(KINDS)}})
    assert done["source"] == f"queue:{queue.id}" and done["counts"]["labelled"] == ROWS
    assert done["better"] is True and done["candidateFigures"]["spearman"]["value"] == pytest.approx(1.0)


async def _take(url: str, queue: ReviewQueue, items: list[ReviewItem]) -> None:
    redis = connect(url)
    try:
        for n, item in enumerate(items):
            await ReviewItems(redis).take([(item, queue)], time.time() + n * 0.001)
    finally:
        await redis.aclose()


def test_a_shared_judge_is_measured_and_shadowed_by_no_project(api: tuple[ApiProcess, str]) -> None:
    """A shared judge's prompt is every project's: no project key may measure, shadow or promote
    it (a shadow would put one tenant's candidate on the others' traffic and budgets)."""
    process, key = api
    _, dataset = setup(process, key)
    operator = create_key(process.redis_url, "--operator")
    with process.client(operator) as http:
        shared = http.post("/v1/judges", json={"name": "Shared", "criteria": "Helpful?"}).json()["id"]
    with process.client(key) as http:
        for method, path, body in [
                ("POST", f"/v1/judges/{shared}/alignments", {"dataset": dataset, "candidate": {}, "shadowHours": 1}),
                ("GET", f"/v1/judges/{shared}/alignments", None),
                ("POST", f"/v1/judges/{shared}/promote", {"alignment": "al_x"})]:
            answer = http.request(method, path, json=body)
            assert answer.status_code == 403, (method, path, answer.text)


def test_a_candidate_keeps_to_the_examples_cap(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    judge, dataset = setup(process, key)
    nine = [{"id": f"e{n}", "input": "q", "output": f"a{n}", "rating": 5} for n in range(9)]  # SGW_JUDGE_MAX_EXAMPLES: 8
    with process.client(key) as http:
        refused = http.post(f"/v1/judges/{judge}/alignments", json={"dataset": dataset, "candidate": {"examples": nine}})
        assert refused.status_code == 400 and "candidate.examples" in refused.text, refused.text
