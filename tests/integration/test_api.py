"""The HTTP API as a real process on the real Redis: every rule of the spec's SDK surface through
HTTP, problem responses naming the field, ETags, pagination, keys and tenancy, the change log,
write-only secrets and the metrics."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api_process import ApiProcess, cli, create_key
from tests.support.redis_clients import connect, connect_sync
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

FULL_ONLINE = {"enabled": True, "sampleRate": 0.2, "alertThreshold": 6, "severity": "high"}
PROBLEM = "application/problem+json"
FILTER_LEAF = {"field": "metadata.environment", "op": "eq", "value": "production"}


class Api:
    def __init__(self, process: ApiProcess, url: str, keys: dict[str, str]) -> None:
        self.process, self.redis_url, self.keys = process, url, keys

    def as_(self, who: str) -> httpx.Client:
        return self.process.client(self.keys[who])


@pytest.fixture(scope="module")
def seeded_api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    with redis_databases.lease() as url:
        keys = {"a": create_key(url, "--project", "p-a", "--name", "team a"),
                "b": create_key(url, "--project", "p-b"),
                "op": create_key(url, "--operator", "--name", "ops")}
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield Api(process, url, keys)
        finally:
            process.stop()


def member(kind: str, ref: str, weight: float = 1, gate: bool = False) -> dict[str, Any]:
    return {"kind": kind, "refId": ref, "weight": weight, "gate": gate}


@pytest.fixture(scope="module")
def scorers(seeded_api: Api) -> dict[str, str]:
    """Judges and a pattern of project A, and one judge the operators share."""
    ids = {}
    with seeded_api.as_("a") as a, seeded_api.as_("op") as op:
        for name, body in (("quality", {"name": "Quality", "criteria": "Helpful?"}),
                           ("safety", {"name": "Safety", "criteria": "Safe?"}),
                           ("exact", {"name": "Exact", "criteria": "Matches?", "requiresExpected": True})):
            r = a.post("/v1/judges", json=body)
            assert r.status_code == 201, r.text
            ids[name] = r.json()["id"]
        r = a.post("/v1/patterns", json={"name": "PII", "polarity": "failure", "template": "email"})
        assert r.status_code == 201, r.text
        ids["pii"] = r.json()["id"]
        r = op.post("/v1/judges", json={"name": "Shared tone", "criteria": "Polite?"})
        assert r.status_code == 201 and r.json()["projectId"] is None, r.text
        ids["shared"] = r.json()["id"]
    return ids


def create_group(client: httpx.Client, **body: Any) -> dict[str, Any]:
    r = client.post("/v1/scorer-groups", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def assert_problem(r: httpx.Response, status: int, field: str | None = None, says: str = "") -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body = r.json()
    assert body["status"] == status and body["title"] and body["detail"]
    if field is not None:
        assert field in [e["field"] for e in body["errors"]], body
    assert says in r.text, body
    return body


# --- Keys ------------------------------------------------------------------------------------


def test_keys_are_needed_known_and_revoked_at_once(seeded_api: Api) -> None:
    with seeded_api.process.client(None) as anonymous:
        r = anonymous.get("/v1/scorer-groups")
        assert_problem(r, 401)
        assert r.headers["www-authenticate"] == "Bearer"
    with seeded_api.process.client("sgw_000000000000_guess") as wrong:
        assert_problem(wrong.get("/v1/scorer-groups"), 401, says="unknown or revoked")
    key = create_key(seeded_api.redis_url, "--project", "p-a", "--name", "short-lived")
    with seeded_api.process.client(key) as c:
        assert c.get("/v1/scorer-groups").status_code == 200
        key_id = key.split("_")[1]
        listed = cli(seeded_api.redis_url, "keys", "list", "--project", "p-a")
        assert key_id in listed.stdout and key not in listed.stdout, "the secret is never shown again"
        revoked = cli(seeded_api.redis_url, "keys", "revoke", key_id)
        assert revoked.returncode == 0, revoked.stderr
        assert_problem(c.get("/v1/scorer-groups"), 401)  # the very next request
    stored = connect_sync(seeded_api.redis_url).hgetall("sgw:api-keys")
    assert all(key.encode() not in v for v in stored.values()), "Redis keeps a hash, not the key"


def test_keys_create_prints_the_key_alone_on_the_last_line(seeded_api: Api) -> None:
    done = cli(seeded_api.redis_url, "keys", "create", "--project", "p-z", "--name", "ci")
    last = done.stdout.rstrip("\n").splitlines()[-1]
    assert last.startswith("sgw_") and " " not in last
    assert done.stdout.count(last) == 1
    refused = cli(seeded_api.redis_url, "keys", "create", "--name", "x")
    assert refused.returncode == 2, "a key is for a project or an operator key, never implicitly both"


# --- Groups: the spec's rules through HTTP ------------------------------------------------------


def test_create_get_list_delete_with_location_and_etag(seeded_api: Api, scorers: dict[str, str]) -> None:
    with seeded_api.as_("a") as a:
        r = a.post("/v1/scorer-groups", json={"name": "Release quality bar", "members": [
            member("judge", scorers["quality"]), member("judge", scorers["safety"], gate=True),
            member("pattern", scorers["pii"], 0, True)]})
        assert r.status_code == 201, r.text
        group = r.json()
        assert group["projectId"] == "p-a", "the key's project; the body names none"
        assert r.headers["location"] == f"/v1/scorer-groups/{group['id']}"
        got = a.get(r.headers["location"])
        assert got.json() == group and got.headers["etag"] == r.headers["etag"]
        assert group["id"] in [g["id"] for g in a.get("/v1/scorer-groups").json()["items"]]
        assert a.delete(f"/v1/scorer-groups/{group['id']}").status_code == 204
        assert_problem(a.get(f"/v1/scorer-groups/{group['id']}"), 404)


def test_lists_are_paginated(seeded_api: Api, scorers: dict[str, str]) -> None:
    with seeded_api.as_("op") as op:
        made = {create_group(op, name=f"Paged {i}", projectId="p-pages",
                             members=[member("judge", scorers["shared"])])["id"] for i in range(5)}
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            body = op.get("/v1/scorer-groups", params=params).json()
            assert len(body["items"]) <= 2
            seen += [g["id"] for g in body["items"]]
            cursor = body["nextCursor"]
            if cursor is None:
                break
        assert made <= set(seen) and len(seen) == len(set(seen)), "every group once"
        assert_problem(op.get("/v1/scorer-groups", params={"limit": 0}), 400, "limit")


def test_patch_is_sparse_and_online_merges_key_by_key(seeded_api: Api, scorers: dict[str, str]) -> None:
    with seeded_api.as_("a") as a:
        g = create_group(a, name="G", members=[member("judge", scorers["quality"])],
                         online={**FULL_ONLINE, "scope": "session", "idleSeconds": 300})
        r = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"sampleRate": 0.5, "severity": "critical"}})
        assert r.status_code == 200, r.text
        g2 = r.json()
        assert g2["name"] == "G" and g2["members"] == g["members"], "omitted fields keep their values"
        assert g2["online"] == {**FULL_ONLINE, "scope": "session", "idleSeconds": 300, "sampleRate": 0.5,
                                "severity": "critical", "alertOnNoScore": True}
        opted_out = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"alertOnNoScore": False}}).json()
        assert opted_out["online"] == {**g2["online"], "alertOnNoScore": False}, "a group may opt out"
        salted = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"sampleSalt": "v2"}}).json()
        assert salted["online"] == {**opted_out["online"], "sampleSalt": "v2"}, "a sample of its own"
        shared = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"sampleSalt": None}}).json()
        assert shared["online"] == opted_out["online"], "sampleSalt: null, back to the shared sample"
        aimed = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"filter": FILTER_LEAF}}).json()
        assert aimed["online"] == {**opted_out["online"], "filter": FILTER_LEAF}, "a filter merges like any key"
        other = {"any": [FILTER_LEAF, {"field": "agentId", "op": "startsWith", "value": "support"}]}
        moved = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"filter": other, "sampleRate": 0.3}}).json()
        assert moved["online"] == {**opted_out["online"], "filter": other, "sampleRate": 0.3}, "a new filter replaces it"
        refused = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"filter": {"any": [{"field": "x"}]}}})
        assert_problem(refused, 400, "online.filter.any[0].field")
        unaimed = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"filter": None}}).json()
        assert unaimed["online"] == {**opted_out["online"], "sampleRate": 0.3}, "filter: null, all traffic again"
        steps = {"field": "kind", "op": "eq", "value": "tool"}
        refused = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"scope": "span"}})
        assert_problem(refused, 400, "online.spanFilter", says="required when scope is span")
        spans = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"scope": "span", "spanFilter": steps}}).json()
        assert spans["online"]["scope"] == "span" and spans["online"]["spanFilter"] == steps
        back = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"scope": "trace"}}).json()
        assert back["online"]["scope"] == "trace", "sending scope: trace flips a span group back"
        r = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": None})
        assert r.status_code == 200 and r.json()["online"] is None, "online: null detaches"


def test_partial_online_on_a_group_without_one_is_a_400_naming_the_missing_keys(seeded_api: Api, scorers: dict[str, str]) -> None:
    with seeded_api.as_("a") as a:
        g = create_group(a, name="G", members=[member("judge", scorers["quality"])])
        r = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": {"sampleRate": 0.5}})
        assert_problem(r, 400, "online", says="missing: enabled, alertThreshold, severity")
        assert "send a full online object" in r.json()["detail"]
        assert a.get(f"/v1/scorer-groups/{g['id']}").json()["online"] is None, "nothing invented"


def test_unknown_ref_and_requires_expected_on_a_live_group_are_400s(seeded_api: Api, scorers: dict[str, str]) -> None:
    with seeded_api.as_("a") as a:
        r = a.post("/v1/scorer-groups", json={"name": "G", "members": [member("judge", scorers["quality"]),
                                                                        member("judge", "nope")]})
        assert_problem(r, 400, "members[1].refId", says="no LLM judge with id 'nope'")
        r = a.post("/v1/scorer-groups", json={"name": "G", "members": [member("judge", scorers["exact"])],
                                              "online": FULL_ONLINE})
        assert_problem(r, 400, "members[0].refId", says="has requiresExpected and cannot grade live traffic")
        g = create_group(a, name="Off", members=[member("judge", scorers["exact"])])
        r = a.patch(f"/v1/scorer-groups/{g['id']}", json={"online": FULL_ONLINE})
        assert_problem(r, 400, "members[0].refId", says="requiresExpected")


@pytest.mark.parametrize(("change", "field"), [
    ({"members": [member("judge", "q", weight=1001)]}, "members[0].weight"),
    ({"members": [member("judge", "q", weight=-1)]}, "members[0].weight"),
    ({"members": []}, "members"),
    ({"members": [member("judge", "q")] * 21}, "members"),
    ({"online": {**FULL_ONLINE, "sampleRate": 1.5}}, "online.sampleRate"),
    ({"online": {**FULL_ONLINE, "alertThreshold": 11}}, "online.alertThreshold"),
    ({"online": {**FULL_ONLINE, "idleSeconds": 86401}}, "online.idleSeconds"),
    ({"online": {**FULL_ONLINE, "severity": "urgent"}}, "online.severity"),
    ({"online": {**FULL_ONLINE, "sampleSalt": "new\nrubric"}}, "online.sampleSalt"),
    ({"online": {**FULL_ONLINE, "sampleSalt": ""}}, "online.sampleSalt"),
    # money: a group's daily cap is a figure of the currency, 0 to a million
    ({"online": {**FULL_ONLINE, "maxCostPerDay": -1}}, "online.maxCostPerDay"),
    ({"online": {**FULL_ONLINE, "maxCostPerDay": 10**7}}, "online.maxCostPerDay"),
    ({"online": {**FULL_ONLINE, "maxCostPerDay": "5 USD"}}, "online.maxCostPerDay"),
    ({"name": ""}, "name"),
    ({"members": [{**member("judge", "q"), "weight": "1"}]}, "members[0].weight"),
    # online.filter: an unknown field root, an op that does not fit its value, a regex RE2
    # refuses, too deep, too many conditions
    ({"online": {**FULL_ONLINE, "filter": {"field": "user.id", "op": "eq", "value": "x"}}}, "online.filter.field"),
    ({"online": {**FULL_ONLINE, "filter": {"all": [FILTER_LEAF, {**FILTER_LEAF, "op": "like"}]}}},
     "online.filter.all[1].op"),
    ({"online": {**FULL_ONLINE, "filter": {"any": [{"not": {"field": "durationMs", "op": "gt", "value": "slow"}}]}}},
     "online.filter.any[0].not.value"),
    ({"online": {**FULL_ONLINE, "filter": {"any": [FILTER_LEAF, {"field": "root.output", "op": "matches",
                                                                 "value": "(a)\\1"}]}}}, "online.filter.any[1].value"),
    ({"online": {**FULL_ONLINE, "filter": {"not": {"not": {"not": {"not": {"not": FILTER_LEAF}}}}}}},
     "online.filter.not.not.not.not.not"),
    ({"online": {**FULL_ONLINE, "filter": {"any": [FILTER_LEAF] * 33}}}, "online.filter.any"),
    # span scope: its spanFilter is required, and names a span's fields
    ({"online": {**FULL_ONLINE, "scope": "span"}}, "online.spanFilter"),
    ({"online": {**FULL_ONLINE, "scope": "span", "spanFilter": FILTER_LEAF}}, "online.spanFilter.field"),
    ({"online": {**FULL_ONLINE, "scope": "span", "spanFilter": {"field": "output", "op": "matches", "value": "(?=x)"}}},
     "online.spanFilter.value"),
])
def test_every_save_time_limit_is_a_400_naming_the_field(seeded_api: Api, scorers: dict[str, str],
                                                         change: dict[str, Any], field: str) -> None:
    body = {"name": "G", "members": [member("judge", scorers["quality"])], **change}
    with seeded_api.as_("a") as a:
        assert_problem(a.post("/v1/scorer-groups", json=body), 400, field)


def test_a_refusal_names_a_long_value_without_echoing_it_in_one_wording(seeded_api: Api, scorers: dict[str, str]) -> None:
    long = "d" * 2001
    with seeded_api.as_("a") as a:
        # Refused by the API's request model, and by the group's own model: the same wording.
        for answer in (a.post("/v1/scorer-groups", json={"name": "G", "members": [], "description": long}),
                       a.post("/v1/datasets", json={"name": "D", "content": "{}\n", "description": long}),
                       a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 1, "windowSeconds": "x" * 500})):
            body = assert_problem(answer, 400)
            assert body["detail"].startswith("invalid request: "), body["detail"]
            assert "d" * 200 not in answer.text and "x" * 200 not in answer.text, "the value is not echoed whole"
            assert len(answer.text) < 1500
        described = a.post("/v1/scorer-groups", json={"name": "G", "members": [], "description": long}).json()
        message = described["errors"][0]["message"]
        assert described["errors"][0]["field"] == "description" and "2,001 characters" in message, message


def test_stale_if_match_is_a_412_and_the_current_one_writes(seeded_api: Api, scorers: dict[str, str]) -> None:
    with seeded_api.as_("a") as a:
        r = a.post("/v1/scorer-groups", json={"name": "G", "members": [member("judge", scorers["quality"])]})
        first = r.headers["etag"]
        r = a.patch(f"/v1/scorer-groups/{r.json()['id']}", json={"name": "G2"}, headers={"If-Match": first})
        assert r.status_code == 200 and r.headers["etag"] != first
        gid = r.json()["id"]
        stale = a.patch(f"/v1/scorer-groups/{gid}", json={"name": "G3"}, headers={"If-Match": first})
        assert_problem(stale, 412)
        assert_problem(a.delete(f"/v1/scorer-groups/{gid}", headers={"If-Match": first}), 412)
        assert a.get(f"/v1/scorer-groups/{gid}").json()["name"] == "G2", "nothing written"
        assert a.delete(f"/v1/scorer-groups/{gid}", headers={"If-Match": r.headers["etag"]}).status_code == 204


# --- Tenancy ----------------------------------------------------------------------------------


def test_two_projects_see_only_their_own(seeded_api: Api, scorers: dict[str, str]) -> None:
    with seeded_api.as_("a") as a, seeded_api.as_("b") as b:
        g = create_group(a, name="Mine", members=[member("judge", scorers["quality"])])
        path = f"/v1/scorer-groups/{g['id']}"
        for r in (b.get(path), b.patch(path, json={"name": "Theirs"}), b.delete(path),
                  b.get(path + "/ratings"), b.get(path + "/changes"), b.get(f"/v1/judges/{scorers['quality']}"),
                  b.put(f"/v1/judges/{scorers['quality']}", json={"name": "X", "criteria": "Y"}),
                  b.delete(f"/v1/patterns/{scorers['pii']}"), b.get("/v1/budgets/p-a")):
            assert_problem(r, 404)
            assert "Mine" not in r.text and "Quality" not in r.text
        assert g["id"] not in [x["id"] for x in b.get("/v1/scorer-groups").json()["items"]]
        assert scorers["quality"] not in [j["id"] for j in b.get("/v1/judges").json()["items"]]
        # Another project's scorer is as unknown as one that does not exist.
        r = b.post("/v1/scorer-groups", json={"name": "Borrow", "members": [member("judge", scorers["quality"])]})
        assert_problem(r, 400, "members[0].refId", says="no LLM judge with id")
        # A project may not write into another one.
        r = b.post("/v1/scorer-groups", json={"name": "X", "projectId": "p-a",
                                              "members": [member("judge", scorers["shared"])]})
        assert_problem(r, 400, "projectId")
        assert a.get(path).json()["name"] == "Mine"


def test_shared_scorers_are_read_and_used_by_projects_but_changed_by_operators(seeded_api: Api, scorers: dict[str, str]) -> None:
    shared = f"/v1/judges/{scorers['shared']}"
    with seeded_api.as_("a") as a, seeded_api.as_("op") as op:
        assert a.get(shared).status_code == 200
        create_group(a, name="Uses shared", members=[member("judge", scorers["shared"])])
        assert_problem(a.put(shared, json={"name": "Mine now", "criteria": "?"}), 403)
        assert_problem(a.delete(shared), 403)
        r = op.put(shared, json={"name": "Shared tone", "criteria": "Polite and warm?"})
        assert r.status_code == 200 and r.json()["criteria"] == "Polite and warm?"


def test_operator_key_acts_on_any_project_and_must_name_one_to_create(seeded_api: Api, scorers: dict[str, str]) -> None:
    with seeded_api.as_("a") as a, seeded_api.as_("op") as op:
        g = create_group(a, name="A's", members=[member("judge", scorers["quality"])])
        assert op.get(f"/v1/scorer-groups/{g['id']}").status_code == 200
        assert op.patch(f"/v1/scorer-groups/{g['id']}", json={"description": "ops note"}).status_code == 200
        assert_problem(op.post("/v1/scorer-groups", json={"name": "X", "members": [member("judge", scorers["shared"])]}),
                       400, "projectId")
        r = op.post("/v1/scorer-groups", json={"name": "For B", "projectId": "p-b",
                                               "members": [member("judge", scorers["shared"])]})
        assert r.status_code == 201
        with seeded_api.as_("b") as b:
            assert b.get(f"/v1/scorer-groups/{r.json()['id']}").status_code == 200


def test_ratings_and_session_scores_are_the_projects_own(seeded_api: Api, scorers: dict[str, str]) -> None:
    import asyncio

    from adapters.stores.ratings import RatingsStore, SessionVerdict
    from scoring.results import HistoryEntry

    with seeded_api.as_("a") as a, seeded_api.as_("op") as op:
        ga = create_group(a, name="A live", members=[member("judge", scorers["quality"])], online=FULL_ONLINE)
        gb = create_group(op, name="B live", projectId="p-b", members=[member("judge", scorers["shared"])],
                          online=FULL_ONLINE)

        async def record() -> None:
            redis = connect(seeded_api.redis_url)
            now = time.time()
            await RatingsStore(redis).write(
                [HistoryEntry(ga["id"], 8.0, False, now), HistoryEntry(ga["id"], 4.0, True, now)],
                [SessionVerdict("s-shared", ga["id"], 4.5, "Weighted blend: A", now),
                 SessionVerdict("s-shared", gb["id"], 9.0, "Weighted blend: B", now),
                 SessionVerdict("s-only-a", ga["id"], 7.0, "Weighted blend: A", now)])
            await redis.aclose()

        asyncio.run(record())
        r = a.get(f"/v1/scorer-groups/{ga['id']}/ratings", params={"window": "1h"})
        assert r.status_code == 200, r.text
        assert (r.json()["count"], r.json()["mean"], r.json()["belowThreshold"]) == (2, 6.0, 1)
        assert len(r.json()["buckets"]) == 60
        assert_problem(a.get(f"/v1/scorer-groups/{ga['id']}/ratings", params={"window": "2d"}), 400, "window")
        scores = a.get("/v1/sessions/s-shared/scores").json()
        assert scores == [{"kind": f"scorer-group:{ga['id']}", "rating": 4.5,
                           "justification": "Weighted blend: A", "scoredAt": scores[0]["scoredAt"]}]
        with seeded_api.as_("b") as b:
            assert [s["kind"] for s in b.get("/v1/sessions/s-shared/scores").json()] == [f"scorer-group:{gb['id']}"]
            nothing = b.get("/v1/sessions/s-only-a/scores")  # only another project's verdict: none of b's
            assert nothing.status_code == 200 and nothing.json() == []
            assert b.get("/v1/sessions/s-never-seen/scores").json() == []
        assert a.get("/v1/sessions/s-only-a/scores").json()[0]["rating"] == 7.0


# --- The change log -----------------------------------------------------------------------------


def test_every_write_is_recorded_who_when_what(seeded_api: Api, scorers: dict[str, str]) -> None:
    before = time.time()
    with seeded_api.as_("a") as a, seeded_api.as_("b") as b:
        g = create_group(a, name="Logged", members=[member("judge", scorers["quality"])])
        a.patch(f"/v1/scorer-groups/{g['id']}", json={"name": "Logged 2", "online": FULL_ONLINE})
        a.delete(f"/v1/scorer-groups/{g['id']}")
        r = a.get(f"/v1/scorer-groups/{g['id']}/changes")
        assert r.status_code == 200, r.text
        entries = r.json()["items"]
        assert [e["action"] for e in entries] == ["deleted", "updated", "created"]
        key_id = seeded_api.keys["a"].split("_")[1]
        assert all(e["actor"] == f"key:{key_id} (team a)" and e["at"] >= before for e in entries)
        assert entries[1]["changes"]["name"] == {"before": "Logged", "after": "Logged 2"}
        assert entries[1]["changes"]["online"]["before"] is None
        assert set(entries[1]["changes"]) == {"name", "online"}
        assert_problem(b.get(f"/v1/scorer-groups/{g['id']}/changes"), 404), "not even once deleted"


# --- Scorers, budgets, channels ------------------------------------------------------------------


def test_scorer_crud_for_every_kind(seeded_api: Api) -> None:
    bodies = {"judges": {"name": "J", "criteria": "Good?"},
              "patterns": {"name": "P", "polarity": "proper", "contains": ["thanks"]},
              "customs": {"name": "C", "type": "code", "code": "def score(**kw):\n    return 1.0\n"}}
    with seeded_api.as_("a") as a:
        for path, body in [*bodies.items(), ("customs", {"name": "E", "type": "external",
                                                         "url": "https://scorer.example.com/x"})]:
            r = a.post(f"/v1/{path}", json=body)
            assert r.status_code == 201, r.text
            doc = r.json()
            assert doc["projectId"] == "p-a" and r.headers["location"].endswith(doc["id"])
            r = a.put(f"/v1/{path}/{doc['id']}", json={**body, "name": "Renamed"}, headers={"If-Match": r.headers["etag"]})
            assert r.status_code == 200 and r.json()["name"] == "Renamed"
            assert a.get(f"/v1/{path}/{doc['id']}").json()["name"] == "Renamed"
            assert a.delete(f"/v1/{path}/{doc['id']}").status_code == 204
            assert_problem(a.get(f"/v1/{path}/{doc['id']}"), 404)
        assert_problem(a.post("/v1/patterns", json={"name": "Bad", "polarity": "failure", "regex": "(a)\\1"}),
                       400, "regex", says="RE2")
        assert_problem(a.post("/v1/customs", json={"name": "Bad", "type": "code", "url": "https://x"}), 400)
        assert_problem(a.post("/v1/judges", json={"name": "J", "criteria": "x", "id": "mine"}), 400, "id")


def test_a_budget_is_set_by_the_operators_and_its_project_may_only_lower_it(seeded_api: Api) -> None:
    with seeded_api.as_("a") as a, seeded_api.as_("op") as op:
        assert_problem(a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 100}), 403, says="operators set budgets")
        r = op.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 100, "windowSeconds": 3600})
        assert r.status_code == 200 and r.json() == {"projectId": "p-a", "judgeCallsPerWindow": 100,
                                                     "windowSeconds": 3600, "judgeTokensPerWindow": None,
                                                     "projectJudgeCallsPerWindow": None,
                                                     "projectJudgeTokensPerWindow": None}
        assert a.get("/v1/budgets").json()["items"] == [r.json()], "the project reads it"
        assert_problem(a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 101}), 403,
                       says="above the operators' cap of 100")
        assert_problem(a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 10**12}), 403)
        assert_problem(a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 50, "windowSeconds": 60}), 403,
                       says="windowSeconds")
        lowered = a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 40})
        assert lowered.status_code == 200, lowered.text
        assert (lowered.json()["judgeCallsPerWindow"], lowered.json()["projectJudgeCallsPerWindow"]) == (100, 40)
        assert_problem(a.delete("/v1/budgets/p-a"), 403, says="cannot delete")
        # The operators' next change keeps the project's own, lower cap.
        raised = op.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 200})
        assert (raised.json()["judgeCallsPerWindow"], raised.json()["projectJudgeCallsPerWindow"]) == (200, 40)
        assert_problem(a.put("/v1/budgets/p-b", json={"judgeCallsPerWindow": 1}), 404)
        assert_problem(a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": -1}), 400, "judgeCallsPerWindow")
        # Money, the same way: the operators' cap, a project's lower one, never higher.
        priced = op.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 200, "judgeCostPerWindow": 25})
        assert priced.status_code == 200 and priced.json()["judgeCostPerWindow"] == 25
        assert_problem(a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 40, "judgeCostPerWindow": 30}), 403,
                       says="judgeCostPerWindow: 30 is above the operators' cap of 25")
        cheaper = a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 40, "judgeCostPerWindow": 5.5})
        assert cheaper.status_code == 200 and cheaper.json()["projectJudgeCostPerWindow"] == 5.5
        assert a.get("/v1/budgets/p-a").json()["used"]["judgeCost"] == 0, "nothing spent yet, in money"
        assert_problem(op.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 1, "judgeCostPerWindow": -1}), 400,
                       "judgeCostPerWindow")
        assert op.delete("/v1/budgets/p-a").status_code == 204


def test_channel_secrets_are_write_only(seeded_api: Api) -> None:
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with seeded_api.as_("a") as a, seeded_api.as_("b") as b:
        r = a.post("/v1/channels", json={"agentId": "bot", "url": "https://hooks.example.com/a", "secret": secret})
        assert r.status_code == 201, r.text
        channel = r.json()
        assert channel["hasSecret"] is True and "secret" not in channel
        for response in (r, a.get(r.headers["location"]), a.get("/v1/channels")):
            assert secret not in response.text and secret[6:20] not in response.text
        assert_problem(b.get(f"/v1/channels/{channel['id']}"), 404)
        assert channel["id"] not in b.get("/v1/channels").text
        assert a.delete(f"/v1/channels/{channel['id']}").status_code == 204
        assert_problem(a.get(f"/v1/channels/{channel['id']}"), 404)


def test_channels_show_format_and_disabled_and_hide_url_credentials(seeded_api: Api) -> None:
    with seeded_api.as_("a") as a:
        r = a.post("/v1/channels", json={"agentId": "pd", "url": "https://u:pa55word@events.example.com/v2?token=t0k3n",
                                         "format": "pagerduty", "routingKey": "R0UT1NGKEY"})
        assert r.status_code == 201, r.text
        for response in (r, a.get(r.headers["location"]), a.get("/v1/channels")):
            for secret in ("pa55word", "t0k3n", "R0UT1NGKEY"):
                assert secret not in response.text
        shown = a.get(r.headers["location"]).json()
        assert shown["format"] == "pagerduty" and shown["disabled"] is False and shown["disabledReason"] is None
        assert_problem(a.post("/v1/channels", json={"agentId": "pd", "url": "https://x.example.com/",
                                                    "format": "pagerduty"}), 400)


# --- Operations -------------------------------------------------------------------------------


def test_metrics_count_requests_by_route_and_status(seeded_api: Api) -> None:
    with seeded_api.as_("a") as a:
        a.get("/v1/scorer-groups/does-not-exist")
        text = httpx.get(seeded_api.process.url + "/metrics").text
    assert 'sgw_api_requests_total{method="GET",route="/v1/scorer-groups/{id}",status="404"}' in text
    assert 'sgw_api_request_seconds_bucket{le="0.005",method="GET",route="/v1/scorer-groups/{id}"}' in text
    assert "does-not-exist" not in text, "labels are route templates, never raw ids"




def test_port_0_picks_a_free_port_and_logs_it(seeded_api: Api, tmp_path: Path) -> None:
    log_path = tmp_path / "api0.log"
    env = {**os.environ, "SGW_REDIS_URL": seeded_api.redis_url, "SGW_API_PORT": "0", "SGW_API_HOST": "127.0.0.1",
           "SGW_LOG_FORMAT": "json", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-m", "worker.cli", "api"], env=env,
                            stdout=open(log_path, "wb"), stderr=subprocess.STDOUT)
    try:
        port = None
        deadline = time.monotonic() + 30
        while port is None and time.monotonic() < deadline:
            events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
            port = next((e["port"] for e in events if e.get("event") == "api listening"), None)
            time.sleep(0.1)
        assert port, log_path.read_text()
        with ApiProcess(seeded_api.redis_url, log_path, port=port).client(seeded_api.keys["a"]) as a:
            assert a.get("/v1/scorer-groups").status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_channels_of_two_projects_for_one_agent_id_stay_apart(seeded_api: Api) -> None:
    import asyncio

    from adapters.stores.catalog import CatalogStore

    with seeded_api.as_("a") as a, seeded_api.as_("b") as b:
        mine = a.post("/v1/channels", json={"agentId": "same-bot", "url": "https://hooks.example.com/a"}).json()
        theirs = b.post("/v1/channels", json={"agentId": "same-bot", "url": "https://hooks.example.com/a"}).json()
        assert mine["id"] != theirs["id"], "the same agent and URL in two projects are two channels"

    async def snapshot() -> Any:
        redis = connect(seeded_api.redis_url)
        try:
            return await CatalogStore(redis).snapshot()
        finally:
            await redis.aclose()

    catalog = asyncio.run(snapshot())
    assert [c.project_id for c in catalog.channels_for("same-bot", "p-a")] == ["p-a"]
    assert [c.project_id for c in catalog.channels_for("same-bot", "p-b")] == ["p-b"]


def test_scorer_writes_are_recorded_too(seeded_api: Api) -> None:
    with seeded_api.as_("a") as a, seeded_api.as_("b") as b:
        judge = a.post("/v1/judges", json={"name": "Tone", "criteria": "Polite?"}).json()
        a.put(f"/v1/judges/{judge['id']}", json={"name": "Tone", "criteria": "Polite and warm?"})
        entries = a.get(f"/v1/judges/{judge['id']}/changes").json()["items"]
        assert [e["action"] for e in entries] == ["updated", "created"]
        assert entries[0]["changes"] == {"criteria": {"before": "Polite?", "after": "Polite and warm?"}}
        assert_problem(b.get(f"/v1/judges/{judge['id']}/changes"), 404)


def test_reads_see_a_change_made_outside_the_api_at_once(seeded_api: Api, scorers: dict[str, str]) -> None:
    import asyncio

    from services.groups import MonitorClient

    with seeded_api.as_("a") as a:
        g = create_group(a, name="Before", members=[member("judge", scorers["quality"])])
        assert a.get(f"/v1/scorer-groups/{g['id']}").json()["name"] == "Before"  # now cached

        async def rename() -> None:
            redis = connect(seeded_api.redis_url)
            try:
                await MonitorClient(redis).scorer_groups.update(g["id"], name="After")  # as the CLI would
            finally:
                await redis.aclose()

        asyncio.run(rename())
        assert a.get(f"/v1/scorer-groups/{g['id']}").json()["name"] == "After"
        changes = a.get(f"/v1/scorer-groups/{g['id']}/changes").json()["items"]
        assert changes[0]["actor"] == "local" and changes[0]["changes"]["name"]["after"] == "After"
