"""A tenant storming its storage quotas, on the real API process and
Redis: creates sent all at once keep exactly the quota (datasets, runs, versions' bytes), and
alignment runs - stored under the judge's keys - count in the project's runs and bytes. Each is
measured in Redis itself: what the project keeps, not what the API answered."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
import pytest
import redis.asyncio as aioredis

from adapters.stores import keys
from adapters.stores.review_items import ReviewItems
from scorer_groups.review_queues import ReviewItem, ReviewQueue
from scoring.review_rules import review_item_id
from tests.support.api_process import ApiProcess, api_with_judge, create_key
from tests.support.redis_clients import connect_sync
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

PROJECT = "p-storm"
QUOTAS = {"SGW_MAX_DATASETS_PER_PROJECT": "5", "SGW_MAX_EVALUATION_RUNS_PER_PROJECT": "5",
          "SGW_MAX_ALIGNMENT_RUNS_PER_PROJECT": "3", "SGW_MAX_PROJECT_STORED_BYTES": "400000"}


@pytest.fixture
def api(redis_databases: RedisDatabases, tmp_path: Path) -> Iterator[tuple[ApiProcess, str]]:
    with api_with_judge(redis_databases, tmp_path, PROJECT, env=QUOTAS) as (process, key, _judge):
        yield process, key


async def _at_once(process: ApiProcess, key: str, requests: list[tuple[str, dict[str, object]]]) -> Counter[int]:
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(base_url=process.url, headers=headers, timeout=60) as http:
        answers = await asyncio.gather(*(http.post(path, json=body) for path, body in requests))
    for answer in answers:
        assert answer.status_code in (201, 409), answer.text
        if answer.status_code == 409:
            assert answer.json()["quota"]["setting"].startswith("SGW_MAX_"), answer.text
    return Counter(a.status_code for a in answers)


def test_datasets_created_all_at_once_keep_exactly_the_quota(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    creates = [("/v1/datasets", {"name": f"D{n}", "content": '{"input": "hi"}'}) for n in range(40)]
    answers = asyncio.run(_at_once(process, key, creates))
    assert answers == {201: 5, 409: 35}
    redis = connect_sync(process.redis_url)
    assert redis.hlen(keys.datasets(PROJECT)) == 5
    assert redis.hlen(keys.project_storage(PROJECT)) == 0  # every reservation given back


def test_runs_created_all_at_once_keep_exactly_the_quota(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    with process.client(key) as http:
        pattern = http.post("/v1/patterns", json={"name": "PII", "polarity": "failure", "template": "email"})
        dataset = http.post("/v1/datasets", json={"name": "D", "content": '{"input": "hi"}'})
        assert pattern.status_code == 201 and dataset.status_code == 201
    body = {"datasetId": dataset.json()["id"], "scorerId": pattern.json()["id"],
            "subject": {"kind": "custom_agent", "displayName": "storm"}}
    answers = asyncio.run(_at_once(process, key, [("/v1/evaluations", body)] * 30))
    assert answers == {201: 5, 409: 25}
    assert connect_sync(process.redis_url).zcard(keys.evaluations(PROJECT)) == 5


def test_versions_added_all_at_once_stay_within_the_stored_bytes(api: tuple[ApiProcess, str]) -> None:
    process, key = api
    with process.client(key) as http:
        dataset = http.post("/v1/datasets", json={"name": "D", "content": '{"input": "hi"}'}).json()["id"]
    row = orjson.dumps({"input": "x" * 60_000}).decode()  # six fit in 400 kB, thirty were sent
    answers = asyncio.run(_at_once(process, key, [(f"/v1/datasets/{dataset}/versions", {"content": row})] * 30))
    assert 1 <= answers[201] <= 6 and answers[201] + answers[409] == 30
    redis = connect_sync(process.redis_url)
    stored = sum(redis.strlen(k) for k in redis.scan_iter(f"{keys.PREFIX}:dataset-rows:{{{PROJECT}}}:*"))
    assert stored <= 400_000
    assert int(redis.get(keys.dataset_bytes(PROJECT)) or 0) == stored


def _labelled(http: httpx.Client) -> tuple[str, str]:
    judge = http.post("/v1/judges", json={"name": "Helpful", "criteria": "Helpful?"}).json()["id"]
    content = "\n".join(orjson.dumps({"input": f"q{n}", "output": f"a{n}", "humanRating": n % 10}).decode()
                        for n in range(4))
    dataset = http.post("/v1/datasets", json={"name": "Labelled", "content": content})
    assert dataset.status_code == 201, dataset.text
    return judge, dataset.json()["id"]


def _wait_done(http: httpx.Client, location: str) -> None:
    deadline = time.monotonic() + 120  # generous: a loaded machine grades slowly, and only the end matters
    while http.get(location).json()["state"] == "running":
        assert time.monotonic() < deadline, "the alignment run never finished"
        time.sleep(0.1)


def test_alignment_runs_count_in_the_projects_runs_and_bytes(api: tuple[ApiProcess, str]) -> None:
    """The attack: runs that end at once, each with a large candidate, kept 90 days under the
    judge's keys - today counted nowhere. The fourth is refused, and a candidate past the bytes
    left is refused before anything is stored."""
    process, key = api
    redis = connect_sync(process.redis_url)
    with process.client(key) as http:
        judge, dataset = _labelled(http)
        large = {"criteria": "😀" * 20_000}  # ~80 kB of criteria in each run's document
        for _ in range(3):
            started = http.post(f"/v1/judges/{judge}/alignments", json={"candidate": large, "dataset": dataset})
            assert started.status_code == 202, started.text
            _wait_done(http, started.headers["Location"])
        refused = http.post(f"/v1/judges/{judge}/alignments", json={"candidate": large, "dataset": dataset})
        assert refused.status_code == 409, refused.text
        assert refused.json()["quota"] == {"setting": "SGW_MAX_ALIGNMENT_RUNS_PER_PROJECT", "used": 3, "limit": 3}
        assert redis.zcard(keys.alignments(judge)) == 3
        ledger = {k.decode(): v.decode().split() for k, v in redis.hgetall(keys.project_storage(PROJECT)).items()}
        assert sorted(v[0] for v in ledger.values()) == ["alignment"] * 3
        stored = sum(int(v[2]) for v in ledger.values())
        assert stored == sum(redis.strlen(keys.alignment(judge, t.split(":", 1)[1])) for t in ledger)
        # What they keep counts against the next dataset: 400 kB less three runs' bytes is left.
        left = 400_000 - stored - int(redis.get(keys.dataset_bytes(PROJECT)) or 0)
        too_large = http.post("/v1/datasets", json={"name": "L", "content": orjson.dumps(
            {"input": "y" * (left + 1_000)}).decode()})
        assert too_large.status_code == 409 and too_large.json()["quota"]["setting"] == "SGW_MAX_PROJECT_STORED_BYTES"


def test_an_alignment_run_past_the_stored_bytes_is_refused_before_it_is_stored(
        redis_databases: RedisDatabases, tmp_path: Path) -> None:
    env = {**QUOTAS, "SGW_MAX_PROJECT_STORED_BYTES": "60000"}
    with api_with_judge(redis_databases, tmp_path, PROJECT, env=env) as (process, key, _judge), \
            process.client(key) as http:
        judge, dataset = _labelled(http)
        refused = http.post(f"/v1/judges/{judge}/alignments",
                            json={"candidate": {"criteria": "😀" * 20_000}, "dataset": dataset})
        assert refused.status_code == 409, refused.text
        assert refused.json()["quota"]["setting"] == "SGW_MAX_PROJECT_STORED_BYTES"
        redis = connect_sync(process.redis_url)
        assert redis.zcard(keys.alignments(judge)) == 0 and redis.hlen(keys.project_storage(PROJECT)) == 0


# --- limits on every path, every refusal a problem document -----------

def test_a_judge_document_holds_no_more_examples_than_the_setting_on_any_path(api: tuple[ApiProcess, str]) -> None:
    """The attack: 32 examples of ~9 KB through the judge's own document, past the examples
    endpoint's check - one call's prompt was 310,000 characters."""
    process, key = api
    big = [{"id": f"e{n}", "input": "i" * 4_000, "output": "o" * 4_000, "rating": 5, "reason": "r" * 1_000}
           for n in range(32)]
    with process.client(key) as http:
        created = http.post("/v1/judges", json={"name": "J", "criteria": "Good?", "examples": big})
        assert created.status_code == 400, created.text
        assert created.headers["content-type"].startswith("application/problem+json")
        assert "SGW_JUDGE_MAX_EXAMPLES" in created.json()["detail"]
        assert created.json()["errors"][0]["field"] == "examples"
        judge = http.post("/v1/judges", json={"name": "J", "criteria": "Good?", "examples": big[:8]})
        assert judge.status_code == 201, judge.text
        doc = {k: v for k, v in judge.json().items() if k not in ("id", "projectId")}
        replaced = http.put(f"/v1/judges/{judge.json()['id']}", json={**doc, "examples": big[:9]})
        assert replaced.status_code == 400 and "SGW_JUDGE_MAX_EXAMPLES" in replaced.text
        kept = http.get(f"/v1/judges/{judge.json()['id']}").json()
        assert len(kept["examples"]) == 8


def test_alignment_runs_past_the_projects_one_at_a_time_answer_429_problem_documents(
        api: tuple[ApiProcess, str]) -> None:
    process, key = api
    with process.client(key) as http:
        judge = http.post("/v1/judges", json={"name": "Helpful", "criteria": "Helpful?"}).json()["id"]
        content = "\n".join(orjson.dumps({"input": f"q{n}", "output": f"a{n}", "humanRating": n % 10}).decode()
                            for n in range(200))
        dataset = http.post("/v1/datasets", json={"name": "Labelled", "content": content}).json()["id"]
    body = {"candidate": {"criteria": "Helpful and kind?"}, "dataset": dataset}
    headers = {"Authorization": f"Bearer {key}"}

    async def three() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=process.url, headers=headers, timeout=60) as client:
            return list(await asyncio.gather(*(client.post(f"/v1/judges/{judge}/alignments", json=body)
                                               for _ in range(3))))

    answers = asyncio.run(three())
    assert sorted(a.status_code for a in answers) == [202, 429, 429], [a.text for a in answers]
    for refused in (a for a in answers if a.status_code == 429):
        assert refused.headers["content-type"].startswith("application/problem+json"), refused.text
        assert refused.json()["status"] == 429 and "at most 1 per project" in refused.json()["detail"]
        assert refused.headers["Retry-After"] == "1"
    with process.client(key) as http:  # the connection that was refused goes on answering
        assert http.get("/v1/judges").status_code == 200


def test_a_promotion_needs_the_documented_held_out_cases_unless_forced(api: tuple[ApiProcess, str]) -> None:
    """The attack: a run on one held-out case with equal errors made its candidate the judge
    without ``force``. Four labelled rows leave at most three held-out cases: not enough."""
    process, key = api
    with process.client(key) as http:
        judge, dataset = _labelled(http)
        started = http.post(f"/v1/judges/{judge}/alignments",
                            json={"candidate": {"criteria": "Helpful, kindly?"}, "dataset": dataset})
        assert started.status_code == 202, started.text
        _wait_done(http, started.headers["Location"])
        run = http.get(started.headers["Location"]).json()
        assert run["state"] == "done" and run["current"]["cases"] < 10, run
        refused = http.post(f"/v1/judges/{judge}/promote", json={"alignment": run["id"]})
        assert refused.status_code == 409 and "at least 10" in refused.json()["detail"], refused.text
        assert http.get(f"/v1/judges/{judge}").json()["criteria"] == "Helpful?", "the judge is unchanged"
        forced = http.post(f"/v1/judges/{judge}/promote", json={"alignment": run["id"], "force": True})
        assert forced.status_code == 200 and forced.json()["criteria"] == "Helpful, kindly?", forced.text


async def test_queue_exports_sent_all_at_once_make_no_more_datasets_than_the_quota(
        api: tuple[ApiProcess, str]) -> None:
    """The attack: 25 exports of a review queue at once made 25 datasets past a quota of 5."""
    process, key = api
    reviewer = create_key(process.redis_url, "--project", PROJECT, "--role", "reviewer", "--name", "rita")
    with process.client(key) as http:
        pattern = http.post("/v1/patterns", json={"name": "P", "polarity": "failure", "template": "apology"}).json()
        group = http.post("/v1/scorer-groups", json={
            "name": "G", "members": [{"kind": "pattern", "refId": pattern["id"]}],
            "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high"}}).json()["id"]
        queue = ReviewQueue.model_validate(http.post("/v1/review-queues", json={
            "name": "Q", "groupIds": [group], "rule": {"sampleRate": 1.0}}).json())
    at = datetime.now(UTC).isoformat()
    item = ReviewItem.model_validate({
        "id": review_item_id(queue.id, "r-1"), "queueId": queue.id, "projectId": PROJECT, "groupId": group,
        "ratingId": "r-1", "reason": "sample", "origin": "live", "createdAt": at,
        "subject": {"scope": "trace", "traceId": "t-1", "input": "q", "output": "a"},
        "rating": {"id": "r-1", "groupId": group, "groupName": "G", "projectId": PROJECT, "agentId": "a",
                   "scope": "trace", "traceId": "t-1", "kind": "k", "rating": 2.0, "reason": None,
                   "justification": "", "scoredAt": at, "members": []}})
    redis = aioredis.Redis.from_url(process.redis_url)
    try:
        await ReviewItems(redis).take([(item, queue)], time.time())
    finally:
        await redis.aclose()
    with process.client(reviewer) as person:
        view = person.post(f"/v1/review-queues/{queue.id}/next").json()
        assert person.put(f"/v1/review-items/{view['item']['id']}/labels/me", json={"rating": 4}).status_code == 200
    answers = await _at_once(process, key, [(f"/v1/review-queues/{queue.id}/export", {})] * 25)
    assert answers == {201: 5, 409: 20}
    assert connect_sync(process.redis_url).hlen(keys.datasets(PROJECT)) == 5
