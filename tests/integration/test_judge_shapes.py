"""Any OpenAI-compatible judge: a call refused for a parameter (``max_tokens`` on OpenAI's
reasoning models, ``response_format`` on some gateways) is learned per model and made again
without it, at one more budgeted call; settings skip the refused call; extra headers reach the
endpoint and are secrets; ``scorer-worker check`` makes one small judge call and says what works.
A local OpenAI-compatible judge made to refuse those parameters, word for word as OpenAI does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from pydantic import ValidationError

from adapters.members.http import RetryPolicy
from adapters.members.judge import JudgeClient, RequestShape
from devtools.judge_server import JudgeServer
from scoring.models import Judge
from scoring.subjects import Subject
from tests.support.http_fakes import Reply, ScriptedServer
from worker.settings import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JUDGE = Judge.model_validate({"id": "q", "name": "Quality", "criteria": "Helpful?"})
FAST = RetryPolicy(attempts=2, backoff_base_s=0.01, backoff_cap_s=0.05)


def subject() -> Subject:
    return Subject(scope="trace", input="q", output="a [[rating=8]]", expected=None, spans=[], metadata={},
                   transcript="", project_id="p")


@pytest.mark.parametrize("refused, learned", [
    ("max_tokens", RequestShape("max_completion_tokens", True)),
    ("response_format", RequestShape("max_tokens", False)),
])
async def test_a_refused_parameter_is_learned_and_the_call_made_again_at_one_more_budgeted_call(
        refused: str, learned: RequestShape) -> None:
    retries: list[bool] = []

    async def gate() -> bool:
        retries.append(True)
        return True

    with JudgeServer(refuses=frozenset({refused})) as server:
        client = JudgeClient(server.base_url, policy=FAST, model="reasoner")
        try:
            assert (await client.grade(JUDGE, subject(), retry=gate)).rating == 8
            assert client.shape_for("reasoner") == learned and retries == [True]
            assert (await client.grade(JUDGE, subject(), retry=gate)).rating == 8
            assert retries == [True], "learned once: the next call goes in the shape that works"
            assert all(refused not in body for body in server.requests), "no answered call carried it"
        finally:
            await client.close()


async def test_no_room_for_the_call_without_the_refused_parameter_ends_the_member() -> None:
    async def no_room() -> bool:
        return False

    with JudgeServer(refuses=frozenset({"max_tokens"})) as server:
        client = JudgeClient(server.base_url, policy=FAST)
        try:
            with pytest.raises(Exception, match="budget exhausted"):
                await client.grade(JUDGE, subject(), retry=no_room)
            assert server.requests == []
        finally:
            await client.close()


async def test_the_settings_shape_skips_the_refused_call_and_extra_headers_reach_the_endpoint() -> None:
    with JudgeServer(refuses=frozenset({"max_tokens", "response_format"})) as server:
        client = JudgeClient(server.base_url, policy=FAST, shape=RequestShape("max_completion_tokens", False),
                             extra_headers={"X-Gateway-Config": "cfg-123"}, api_key="sk-judge-key")
        try:
            assert (await client.grade(JUDGE, subject())).rating == 8
        finally:
            await client.close()
    (body,) = server.requests
    assert body["max_completion_tokens"] == 512 and "response_format" not in body
    assert body["_headers"]["x-gateway-config"] == "cfg-123"
    assert body["_headers"]["authorization"] == "Bearer sk-judge-key", "the key is not overridden by a header"


def test_extra_headers_are_a_json_object_of_strings_and_their_values_are_secrets() -> None:
    with pytest.raises(ValidationError, match="judge_extra_headers"):
        Settings(judge_extra_headers='["not", "an object"]')
    settings = Settings(judge_extra_headers='{"X-Gateway-Key": "gk-secret-77"}')
    assert "gk-secret-77" in settings.secrets()


def check(kafka: str, redis_url: str, judge_url: str, *args: str,
          env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SGW_")}, "PYTHONPATH": str(ROOT),
           "SGW_KAFKA_BOOTSTRAP": kafka, "SGW_REDIS_URL": redis_url, "SGW_JUDGE_BASE_URL": judge_url,
           "SGW_JUDGE_MODEL": "o-reasoner", "SGW_LOG_FORMAT": "console", **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "worker.cli", "check", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_check_makes_one_judge_call_and_says_what_works(kafka_bootstrap: str, redis_db_url: str) -> None:
    with JudgeServer(refuses=frozenset({"max_tokens"})) as server:
        done = check(kafka_bootstrap, redis_db_url, server.base_url)
        assert done.returncode == 0, done.stderr
        assert "model o-reasoner  rating" in done.stdout and "max_completion_tokens" in done.stdout
        assert "SGW_JUDGE_TOKEN_LIMIT_PARAM=max_completion_tokens" in done.stdout
        calls = len(server.requests)
        assert check(kafka_bootstrap, redis_db_url, server.base_url, "--no-judge").returncode == 0
        assert len(server.requests) == calls, "--no-judge makes no call"
    unreachable = check(kafka_bootstrap, redis_db_url, "http://127.0.0.1:9/v1")
    assert unreachable.returncode == 1 and "judge at" in unreachable.stderr and "Traceback" not in unreachable.stderr


def test_check_tries_the_judge_span_export_and_keeps_its_headers_secret(kafka_bootstrap: str,
                                                                       redis_db_url: str) -> None:
    with ScriptedServer(Reply(200, {})) as collector:
        export = {"SGW_JUDGE_TRACE_EXPORT": "otlp", "SGW_JUDGE_TRACE_ENDPOINT": collector.url + "/v1/traces",
                  "SGW_JUDGE_TRACE_HEADERS": '{"x-honeycomb-team": "hc-secret-4242"}'}
        taken = check(kafka_bootstrap, redis_db_url, "http://127.0.0.1:9/v1", "--no-judge", env_extra=export)
        assert taken.returncode == 0, taken.stderr
        assert f"spans   {collector.url}/v1/traces  took an export" in taken.stdout
        sent = collector.requests[-1]
        assert sent.path == "/v1/traces" and sent.headers["x-honeycomb-team"] == "hc-secret-4242"
        assert not ExportTraceServiceRequest.FromString(sent.body).resource_spans[0].scope_spans[0].spans
        collector.script(Reply(401, {"error": "hc-secret-4242 is not a key"}))
        refused = check(kafka_bootstrap, redis_db_url, "http://127.0.0.1:9/v1", "--no-judge", env_extra=export)
    assert refused.returncode == 1 and "judge span export at" in refused.stderr and "HTTP 401" in refused.stderr
    assert "hc-secret-4242" not in refused.stdout + refused.stderr + taken.stdout + taken.stderr
    away = check(kafka_bootstrap, redis_db_url, "http://127.0.0.1:9/v1", "--no-judge",
                 env_extra={**export, "SGW_JUDGE_TRACE_ENDPOINT": "http://127.0.0.1:9/v1/traces"})
    assert away.returncode == 1 and "unreachable" in away.stderr and "Traceback" not in away.stderr


@pytest.mark.parametrize("error, learned", [
    # vLLM on a context overflow names both parameters: a value too large is no refusal of the parameter.
    ("judge answered HTTP 400: 'max_tokens' or 'max_completion_tokens' is too large: 512. This model's maximum "
     "context length is 4096 tokens", None),
    ("judge answered HTTP 400: Unsupported parameter: 'max_tokens' is not supported with this model. "
     "Use 'max_completion_tokens' instead.", RequestShape("max_completion_tokens", True)),
    ("judge answered HTTP 400: Unrecognized request argument supplied: response_format",
     RequestShape("max_tokens", False)),
    ("judge answered HTTP 400: response_format: invalid value 'json_object'", None),
    ("judge answered HTTP 500: Unsupported parameter: 'max_tokens'", None),
])
def test_only_a_refusal_of_the_parameter_itself_is_learned(error: str, learned: RequestShape | None) -> None:
    assert RequestShape().without_refused(error) == learned


async def test_every_shape_can_be_tried_before_giving_up() -> None:
    with JudgeServer(refuses=frozenset({"max_tokens", "max_completion_tokens", "response_format"})) as server:
        client = JudgeClient(server.base_url, policy=FAST)
        try:
            assert (await client.grade(JUDGE, subject())).rating == 8, "three refusals, the fourth shape answers"
            assert client.shape_for("gpt-4o-mini") == RequestShape("none", False)
        finally:
            await client.close()
