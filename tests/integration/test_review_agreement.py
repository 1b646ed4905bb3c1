"""Agreement as it happens, on the real API process and Redis: two reviewers label a
group's review items through the API, and ``GET /v1/scorer-groups/{id}/agreement`` answers the
figures scipy and scikit-learn give on the same numbers - the group's and its judge's against the
people's median, and the reviewers against each other."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from scipy.stats import spearmanr
from sklearn.metrics import cohen_kappa_score, mean_absolute_error

from adapters.stores.review_items import ReviewItems
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.review_rules import review_item_id
from tests.support.api_process import ApiProcess, api_with_judge, cli, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

PROJECT = "p-agree"
ITEMS = 12
GROUP_SCORES = [2.0, 3.5, 9.0, 7.0, 1.0, 6.0, 8.5, 4.0, 5.5, 9.5, 0.5, 7.5]
JUDGE_SCORES = [3.0, 3.0, 8.0, 6.0, 2.0, 7.0, 9.0, 5.0, 4.0, 10.0, 1.0, 6.0]
ANN = [2, 4, 9, 6, 1, 5, 9, 3, 6, 10, 1, 8]
BOB = [3, 3, 8, 8, 2, 7, 7, 5, 4, 9, 0, 6]


@pytest.fixture(scope="module")
def api(redis_databases: RedisDatabases,
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str, str, str]]:
    with redis_databases.lease() as url:
        admin = create_key(url, "--project", PROJECT)
        ann = create_key(url, "--project", PROJECT, "--role", "reviewer", "--name", "ann")
        bob = create_key(url, "--project", PROJECT, "--role", "reviewer", "--name", "bob")
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield process, admin, ann, bob
        finally:
            process.stop()


def item(queue: ReviewQueue, n: int, judge: str, *, group_score: float | None = None, output: str = "a",
         project: str = PROJECT) -> ReviewItem:
    at = datetime.fromtimestamp(time.time(), UTC).isoformat()
    return ReviewItem.model_validate({
        "id": review_item_id(queue.id, f"r-{n}"), "queueId": queue.id, "projectId": project,
        "groupId": queue.group_ids[0], "ratingId": f"r-{n}", "reason": "sample", "origin": "live", "createdAt": at,
        "subject": {"scope": "trace", "traceId": f"t-{n}", "input": "q", "output": output},
        "rating": {"id": f"r-{n}", "groupId": queue.group_ids[0], "groupName": "Tone", "projectId": project,
                   "agentId": "a", "scope": "trace", "traceId": f"t-{n}", "kind": "k",
                   "rating": GROUP_SCORES[n] if group_score is None else group_score,
                   "reason": None, "justification": "", "scoredAt": at,
                   "members": [{"kind": "judge", "refId": judge, "name": "Helpful", "weight": 1.0, "gate": False,
                                "status": "scored", "native": JUDGE_SCORES[n], "goodness": JUDGE_SCORES[n] / 10,
                                "detail": "."}]}})


async def test_the_live_agreement_is_the_reference_libraries_figures(api: tuple[ApiProcess, str, str, str]) -> None:
    process, admin_key, ann_key, bob_key = api
    with process.client(admin_key) as admin:
        judge = admin.post("/v1/judges", json={"name": "Helpful", "criteria": "Helpful?"}).json()["id"]
        group = admin.post("/v1/scorer-groups", json={
            "name": "Tone", "members": [{"kind": "judge", "refId": judge, "label": "Helpful"}],
            "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}}).json()["id"]
        assert admin.get(f"/v1/scorer-groups/{group}/agreement").json() == {
            "labelledItems": 0, "agreement": None, "reviewers": None}
        queue = ReviewQueue.model_validate(admin.post("/v1/review-queues", json={
            "name": "Both", "groupIds": [group], "rule": {"sampleRate": 1.0}, "reviewersPerItem": 2}).json())
    redis = aioredis.Redis.from_url(process.redis_url)
    try:
        for n in range(ITEMS):
            await ReviewItems(redis).take([(item(queue, n, judge), queue)], time.time() + n * 0.001)
    finally:
        await redis.aclose()
    for key, given in ((ann_key, ANN), (bob_key, BOB)):
        with process.client(key) as reviewer:
            for _ in range(ITEMS):
                view = reviewer.post(f"/v1/review-queues/{queue.id}/next").json()
                n = int(view["item"]["subject"]["traceId"].split("-")[1])
                done = reviewer.put(f"/v1/review-items/{view['item']['id']}/labels/me", json={"rating": given[n]})
                assert done.status_code == 200, done.text
            assert reviewer.post(f"/v1/review-queues/{queue.id}/next").status_code == 204, "all labelled"
    with process.client(admin_key) as admin:
        live = admin.get(f"/v1/scorer-groups/{group}/agreement").json()

    people = [(a + b) / 2 for a, b in zip(ANN, BOB, strict=True)]  # the median of two
    assert live["labelledItems"] == ITEMS
    for column, machine in ((live["agreement"]["group"], GROUP_SCORES), (live["agreement"]["judges"][0], JUDGE_SCORES)):
        assert column["labelledRows"] == ITEMS
        assert column["spearman"] == pytest.approx(spearmanr(machine, people).statistic, abs=1e-4)
        assert column["meanAbsoluteError"] == pytest.approx(mean_absolute_error(people, machine), abs=1e-4)
        at_threshold = next(m for m in column["marks"] if m["mark"] == "alertThreshold")
        expected = cohen_kappa_score([m >= 6 for m in machine], [p >= 6 for p in people])
        assert at_threshold["rows"] == ITEMS and at_threshold["kappa"] == pytest.approx(expected, abs=1e-4)
    assert live["agreement"]["judges"][0]["scorerId"] == judge
    reviewers = live["reviewers"]
    assert reviewers["items"] == ITEMS
    assert reviewers["spearman"] == pytest.approx(spearmanr(ANN, BOB).statistic, abs=1e-4)
    assert reviewers["kappa"] == pytest.approx(cohen_kappa_score([a >= 6 for a in ANN], [b >= 6 for b in BOB]),
                                               abs=1e-4)
    assert reviewers["meanAbsoluteError"] == pytest.approx(mean_absolute_error(ANN, BOB), abs=1e-4)
    with process.client(ann_key) as ann:
        assert ann.get(f"/v1/scorer-groups/{group}/agreement").status_code == 403, "admins' figures"


async def test_peoples_verdict_is_the_median_of_three_unequal_labels(api: tuple[ApiProcess, str, str, str]) -> None:
    """Three reviewers rate one answer 2, 3 and 10: people say 3 (the median), not 5 (the mean).
    The group said 2 there and 8 where all three said 8: its mean absolute error is 0.5."""
    process, admin_key, ann_key, bob_key = api
    cy_key = create_key(process.redis_url, "--project", PROJECT, "--role", "reviewer", "--name", "cy")
    with process.client(admin_key) as admin:
        judge = admin.post("/v1/judges", json={"name": "Helpful", "criteria": "Helpful?"}).json()["id"]
        group = admin.post("/v1/scorer-groups", json={
            "name": "Three", "members": [{"kind": "judge", "refId": judge, "label": "Helpful"}],
            "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}}).json()["id"]
        queue = ReviewQueue.model_validate(admin.post("/v1/review-queues", json={
            "name": "Three", "groupIds": [group], "rule": {"sampleRate": 1.0}, "reviewersPerItem": 3}).json())
    redis = aioredis.Redis.from_url(process.redis_url)
    try:
        for n, score in ((0, 2.0), (1, 8.0)):
            await ReviewItems(redis).take([(item(queue, n, judge, group_score=score), queue)], time.time() + n * 0.001)
    finally:
        await redis.aclose()
    labels = {ann_key: {0: 2, 1: 8}, bob_key: {0: 3, 1: 8}, cy_key: {0: 10, 1: 8}}
    for key, given in labels.items():
        with process.client(key) as reviewer:
            for _ in range(2):
                view = reviewer.post(f"/v1/review-queues/{queue.id}/next").json()
                n = int(view["item"]["subject"]["traceId"].split("-")[1])
                done = reviewer.put(f"/v1/review-items/{view['item']['id']}/labels/me", json={"rating": given[n]})
                assert done.status_code == 200, done.text
    with process.client(admin_key) as admin:
        live = admin.get(f"/v1/scorer-groups/{group}/agreement").json()
        exported = admin.post(f"/v1/review-queues/{queue.id}/export", json={})
        assert exported.status_code == 201, exported.text
        rows = admin.get(f"/v1/datasets/{exported.json()['id']}/rows").json()["items"]
        example = admin.post(f"/v1/judges/{judge}/examples", json={"fromItem": review_item_id(queue.id, "r-0")})
    assert live["labelledItems"] == 2
    assert live["agreement"]["group"]["meanAbsoluteError"] == pytest.approx(0.5), live["agreement"]["group"]
    assert sorted(r["humanRating"] for r in rows) == [3, 8], "the export's people's verdict: the median too"
    assert example.status_code == 201 and example.json()["rating"] == 3, example.text


async def test_an_export_graded_again_gives_the_live_figures(redis_databases: RedisDatabases, tmp_path: Path) -> None:
    """Export the labelled items to a dataset, grade its rows with the group (the same judge
    answering the same verdicts): the run's agreement is the live agreement."""
    with api_with_judge(redis_databases, tmp_path, "p-export") as (process, key, judge_server):
        reviewer = create_key(process.redis_url, "--project", "p-export", "--role", "reviewer", "--name", "ann")
        with process.client(key) as admin:
            judge = admin.post("/v1/judges", json={"name": "Helpful", "criteria": "Helpful?"}).json()["id"]
            group = admin.post("/v1/scorer-groups", json={
                "name": "Tone", "members": [{"kind": "judge", "refId": judge, "label": "Helpful"}],
                "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}}).json()["id"]
            queue = ReviewQueue.model_validate(admin.post("/v1/review-queues", json={
                "name": "Export me", "groupIds": [group], "rule": {"sampleRate": 1.0}}).json())
        redis = aioredis.Redis.from_url(process.redis_url)
        try:
            for n in range(ITEMS):  # the judge's verdict is the group's score; the answer says it to the judge
                one = item(queue, n, judge, group_score=JUDGE_SCORES[n],
                           output=f"answer {n} [[rating={JUDGE_SCORES[n]:g}]]", project="p-export")
                await ReviewItems(redis).take([(one, queue)], time.time() + n * 0.001)
        finally:
            await redis.aclose()
        with process.client(reviewer) as ann:
            for _ in range(ITEMS):
                view = ann.post(f"/v1/review-queues/{queue.id}/next").json()
                n = int(view["item"]["subject"]["traceId"].split("-")[1])
                assert ann.put(f"/v1/review-items/{view['item']['id']}/labels/me",
                               json={"rating": ANN[n]}).status_code == 200
            assert ann.post(f"/v1/review-queues/{queue.id}/export", json={}).status_code == 403, "admins export"
        with process.client(key) as admin:
            live = admin.get(f"/v1/scorer-groups/{group}/agreement").json()["agreement"]
            made = admin.post(f"/v1/review-queues/{queue.id}/export", json={"name": "From review"})
            assert made.status_code == 201, made.text
            dataset = made.json()
            assert (dataset["name"], dataset["rowCount"], dataset["version"]) == ("From review", ITEMS, 1)
            rows = admin.get(f"/v1/datasets/{dataset['id']}/rows").json()["items"]
            again = admin.post(f"/v1/review-queues/{queue.id}/export", json={"dataset": dataset["id"]}).json()
            assert again["version"] == 2, "a new version of the same dataset"
        assert [r["humanRating"] for r in rows] == [float(a) for a in ANN]
        assert rows[4]["input"] == "q" and rows[4]["output"] == f"answer 4 [[rating={JUDGE_SCORES[4]:g}]]"
        assert rows[4]["metadata"]["ratingId"] == "r-4"
        lines = tmp_path / "rows.jsonl"
        lines.write_text("".join(json.dumps(r) + "\n" for r in rows))
        graded = cli(process.redis_url, "grade", "--input", str(lines), "--group", group,
                     env={"SGW_JUDGE_BASE_URL": judge_server.base_url})
        assert graded.returncode == 0, graded.stderr
        summary, _ = json.JSONDecoder().raw_decode(graded.stderr[graded.stderr.index("\n{") + 1:])
    run = summary["agreement"]
    for name in ("group", "judges"):
        ours, theirs = live[name], run[name]
        if name == "judges":
            ours, theirs = ours[0], theirs[0]
        for figure in ("labelledRows", "spearman", "meanAbsoluteError", "marks", "suggestedThreshold"):
            assert ours[figure] == theirs[figure], (name, figure, ours[figure], theirs[figure])
