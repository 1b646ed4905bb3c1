"""What a tenant sends the API is refused whole when it is out of range, with the field named,
and nothing of it is stored: integers past what Redis and Lua hold exactly, ids that no path
could reach again (a "/") or that break logs and clients (control characters, NUL) - in bodies
and in paths alike. The real API process on the real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration
PROBLEM = "application/problem+json"


@pytest.fixture(scope="module")
def client(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with redis_databases.lease() as url:
        key = create_key(url, "--project", "p-bounds")
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            with process.client(key) as c:
                yield c
        finally:
            process.stop()


def refused(answer: httpx.Response, field: str | None = None, says: str = "") -> None:
    assert answer.status_code == 400 and answer.headers["content-type"] == PROBLEM, answer.text
    if field is not None:
        assert field in [e["field"] for e in answer.json()["errors"]], answer.text
    assert says in answer.text


def test_integers_out_of_range_are_refused_naming_the_field_and_nothing_is_stored(client: httpx.Client) -> None:
    refused(client.put("/v1/budgets/p-bounds", json={"judgeCallsPerWindow": 10**40}), "judgeCallsPerWindow",
            "less than or equal to 1000000000000")
    refused(client.put("/v1/budgets/p-bounds", json={"judgeCallsPerWindow": 10**12 + 1}), "judgeCallsPerWindow")
    assert client.get("/v1/budgets/p-bounds").status_code == 404, "nothing was stored"


@pytest.mark.parametrize("bad", ["a/b", "\u0000", "tab\there", "x\u007fy", "c1\u0085x"])
def test_ids_with_a_slash_or_a_control_character_are_refused_and_nothing_is_stored(
        client: httpx.Client, bad: str) -> None:
    refused(client.post("/v1/datasets", json={"id": bad, "name": "D", "content": '{"input": "q"}\n'}), "id",
            "must not contain '/' or control characters")
    refused(client.post("/v1/scorer-groups", json={"id": bad, "name": "G", "members": []}))
    assert bad not in {d["id"] for d in client.get("/v1/datasets").json()["items"]}


def test_a_path_id_is_held_to_the_same_rule(client: httpx.Client) -> None:
    refused(client.get("/v1/datasets/%00"))
    refused(client.get("/v1/scorer-groups/x%09y"))


def test_the_schema_the_fuzzer_reads_bounds_ids_and_budgets(client: httpx.Client) -> None:
    # schemathesis (tests/integration/test_api_schema.py) generates values outside these bounds.
    doc = client.get("/openapi.json").json()["components"]["schemas"]
    assert doc["Budget"]["properties"]["judgeCallsPerWindow"]["maximum"] == 10**12
    assert doc["Budget"]["properties"]["projectId"]["pattern"].startswith("^[^/")
