"""Schemathesis against the OpenAPI document the real API process serves: generated requests
(valid and invalid) to every operation, then stateful sequences (create, then read, change and
delete what was created). No 5xx, and every response - status, content type, headers, body -
as the document says. Plus: the committed document is the served one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from adapters.stores import keys
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_clients import connect_sync
from tests.support.redis_databases import RedisDatabases
from worker.api.openapi import COMMITTED, render

pytestmark = pytest.mark.integration

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def served(redis_databases: RedisDatabases,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ApiProcess, str]]:
    with redis_databases.lease() as url:
        key = create_key(url, "--project", "p-fuzz")
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            # Something to point at: a judge and a pattern the generated groups may refer to.
            with process.client(key) as c:
                c.post("/v1/judges", json={"name": "Fuzz judge", "criteria": "Good?"}).raise_for_status()
                c.post("/v1/patterns", json={"name": "Fuzz pattern", "polarity": "failure",
                                             "template": "email"}).raise_for_status()
            yield process, key
        finally:
            process.stop()


@pytest.fixture(scope="module")
def api_schema(served: tuple[ApiProcess, str]) -> Any:
    return schemathesis.openapi.from_url(served[0].url + "/openapi.json")


def test_every_operation_answers_as_documented(api_schema: Any, served: tuple[ApiProcess, str]) -> None:
    """Each operation in turn (schemathesis' pytest plugin predates this pytest, so Hypothesis
    drives the operations' strategies here), valid and invalid inputs both."""
    auth = {"Authorization": f"Bearer {served[1]}"}
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 25

    for operation in operations:
        @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE)
               | operation.as_strategy(generation_mode=GenerationMode.NEGATIVE))
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def run(case: Any) -> None:
            case.call_and_validate(headers=auth, checks=CHECKS)

        run()


def test_stateful_sequences_answer_as_documented(api_schema: Any, served: tuple[ApiProcess, str]) -> None:
    auth = {"Authorization": f"Bearer {served[1]}"}
    machine = api_schema.as_state_machine()
    transitions = [name for name in dir(machine) if name.startswith("POST_v1_scorer_groups___201_")]
    assert len(transitions) >= 5, "creating a group leads on to reading, changing and deleting it"

    redis = connect_sync(served[0].redis_url)
    kept = {keys.API_KEYS.encode(), keys.CATALOG_VERSION.encode()}

    class Workflow(machine):  # type: ignore[misc, valid-type]
        def setup(self) -> None:
            # Each sequence starts from an empty project - no catalog, datasets or runs - so what
            # it reads back depends only on what it wrote, and Hypothesis can replay and shrink a
            # sequence. The API key stays, and the catalog's version only grows: the API reuses
            # its last snapshot while the version is unchanged, so a version counted again from 0
            # would serve the previous sequence's catalog (Hypothesis: FlakyStrategyDefinition).
            stale = [k for k in redis.scan_iter() if k not in kept]
            if stale:
                redis.delete(*stale)
            redis.incr(keys.CATALOG_VERSION)

        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": auth}

        def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    Workflow.run(settings=settings(max_examples=40, stateful_step_count=6, deadline=None,
                                   suppress_health_check=list(HealthCheck), database=None))


def test_the_committed_openapi_document_is_the_served_one(served: tuple[ApiProcess, str]) -> None:
    served_doc = httpx.get(served[0].url + "/openapi.json").json()
    assert served_doc["openapi"].startswith("3.1")
    assert render(served_doc) == COMMITTED.read_text(), (
        "the API changed: regenerate with `.venv/bin/python -m worker.api.openapi > worker/api/openapi.json`")
