"""Backfill jobs through the API, as a real process on the real Redis: a job
is started (202, queued, with the group's sample or the request's), read, listed and cancelled;
every refusal names its field; another project's job is a 404; a project has at most 3 jobs not
ended; a ``to`` a little ahead of the server's clock is now."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

ONLINE = {"enabled": False, "sampleRate": 0.3, "alertThreshold": 6, "severity": "high"}


@pytest.fixture(scope="module")
def api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, dict[str, str]]]:
    with redis_databases.lease() as url:
        keys = {"a": create_key(url, "--project", "p-a"), "b": create_key(url, "--project", "p-b"),
                "c": create_key(url, "--project", "p-c")}
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield process, keys
        finally:
            process.stop()


def iso(delta: timedelta) -> str:
    return (datetime.now(UTC) + delta).isoformat()


def test_a_job_is_started_read_listed_and_cancelled(api: tuple[ApiProcess, dict[str, str]]) -> None:
    process, keys = api
    with process.client(keys["a"]) as a, process.client(keys["b"]) as b:
        judge = a.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()
        members = [{"kind": "judge", "refId": judge["id"], "weight": 1}]
        aimed = a.post("/v1/scorer-groups", json={"name": "Off", "members": members, "online": ONLINE}).json()
        bare = a.post("/v1/scorer-groups", json={"name": "Bare", "members": members}).json()

        started = a.post(f"/v1/scorer-groups/{aimed['id']}/backfills",
                         json={"from": iso(timedelta(days=-1)), "to": iso(timedelta(minutes=-1))})
        assert started.status_code == 202, started.text
        job: dict[str, Any] = started.json()
        assert (job["status"], job["groupId"], job["sampleRate"], job["maxJudgeCalls"], job["alerts"]) == \
            ("queued", aimed["id"], 0.3, None, False), "the group's sample, even with live scoring off"
        assert job["progress"] == {"fraction": 0.0, "tracesRead": 0, "pairsScored": 0, "pairsSkipped": 0,
                                   "judgeCalls": 0}
        assert a.get(f"/v1/backfills/{job['id']}").json() == job
        assert [j["id"] for j in a.get(f"/v1/scorer-groups/{aimed['id']}/backfills").json()] == [job["id"]]
        assert b.get(f"/v1/backfills/{job['id']}").status_code == 404, "another project's job does not exist"
        assert b.delete(f"/v1/backfills/{job['id']}").status_code == 404

        cancelled = a.delete(f"/v1/backfills/{job['id']}")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert a.delete(f"/v1/backfills/{job['id']}").status_code == 409, "an ended job cannot be cancelled"

        bare_job = a.post(f"/v1/scorer-groups/{bare['id']}/backfills",
                          json={"from": iso(timedelta(hours=-2)), "to": iso(timedelta(hours=-1)), "sampleRate": 1})
        assert bare_job.status_code == 202 and bare_job.json()["sampleRate"] == 1.0


@pytest.mark.parametrize(("body", "field"), [
    ({"from": "-1d"}, "from"),
    ({"to": "2026-12-01T00:00:00"}, "to"),  # no zone
    ({"to": "2020-01-01T00:00:00Z"}, "to"),  # before from
    ({"to": "2999-01-01T00:00:00Z"}, "to"),  # in the future
    ({"sampleRate": 1.5}, "sampleRate"),
    ({"maxJudgeCalls": 0}, "maxJudgeCalls"),
    ({"group": "sessions"}, "scope"),  # a session group: conversations do not fit a window (README)
    ({"sampleRate": None, "group": "bare"}, "sampleRate"),  # no online profile to take it from
])
def test_every_refusal_names_its_field(api: tuple[ApiProcess, dict[str, str]], body: dict[str, Any], field: str) -> None:
    process, keys = api
    with process.client(keys["a"]) as a:
        judge = a.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()
        members = [{"kind": "judge", "refId": judge["id"], "weight": 1}]
        kind = body.pop("group", None)
        online = None if kind == "bare" else {**ONLINE, "scope": "session"} if kind == "sessions" else ONLINE
        group = a.post("/v1/scorer-groups", json={"name": "G", "members": members, "online": online}).json()
        sent = {"from": "2026-01-01T00:00:00Z", "to": iso(timedelta(minutes=-1)), **body}
        refused = a.post(f"/v1/scorer-groups/{group['id']}/backfills", json={k: v for k, v in sent.items() if v is not None})
        assert refused.status_code == 400, refused.text
        assert field in [e["field"] for e in refused.json()["errors"]], refused.json()


def test_a_project_has_at_most_three_jobs_not_ended_and_a_to_just_ahead_is_now(
        api: tuple[ApiProcess, dict[str, str]]) -> None:
    process, keys = api
    with process.client(keys["c"]) as c, process.client(keys["b"]) as b:
        judge = c.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()
        group = c.post("/v1/scorer-groups", json={"name": "G", "members": [{"kind": "judge", "refId": judge["id"]}],
                                                  "online": ONLINE}).json()
        window = {"from": iso(timedelta(hours=-3)), "to": iso(timedelta(seconds=30))}  # a clock a little ahead
        jobs = [c.post(f"/v1/scorer-groups/{group['id']}/backfills", json=window) for _ in range(3)]
        assert [j.status_code for j in jobs] == [202] * 3
        assert datetime.fromisoformat(jobs[0].json()["to"]) <= datetime.now(UTC), "clamped to now"
        fourth = c.post(f"/v1/scorer-groups/{group['id']}/backfills", json=window)
        assert fourth.status_code == 409 and "at most 3" in fourth.text, fourth.text
        b_judge = b.post("/v1/judges", json={"name": "Q", "criteria": "Helpful?"}).json()
        b_group = b.post("/v1/scorer-groups", json={"name": "G", "members": [{"kind": "judge", "refId": b_judge["id"]}],
                                                    "online": ONLINE}).json()
        assert b.post(f"/v1/scorer-groups/{b_group['id']}/backfills", json=window).status_code == 202, \
            "another project's jobs do not count"
        assert c.delete(f"/v1/backfills/{jobs[0].json()['id']}").status_code == 200
        assert c.post(f"/v1/scorer-groups/{group['id']}/backfills", json=window).status_code == 202, "room again"
