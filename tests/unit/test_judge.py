"""LLM judge members through a real OpenAI-compatible server on loopback."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from adapters.members.http import RetryPolicy
from adapters.members.judge import JudgeClient
from devtools.judge_server import Behaviour, JudgeServer
from scoring.judge_prompt import SESSION_QUESTION, parse_verdict
from scoring.models import Judge
from scoring.ports import MemberError
from scoring.subjects import Subject
from tests.support.http_fakes import Reply, ScriptedServer

FAST = RetryPolicy(attempts=3, backoff_base_s=0.01, backoff_cap_s=0.05)
QUALITY = Judge.model_validate({"id": "q", "name": "Quality", "criteria": "Is the answer correct and helpful?",
                                "judgePrompt": "Be strict about arithmetic."})


def subject(output: str = "4 [[rating=8]]", **over: object) -> Subject:
    base = dict(scope="trace", input="What is 2+2?", output=output, expected=None, spans=[],
                metadata={}, transcript="")
    return Subject(**{**base, **over})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server() -> Iterator[JudgeServer]:
    with JudgeServer(api_key="sk-test-key-123") as s:
        yield s


@pytest.fixture
async def client(server: JudgeServer) -> AsyncIterator[JudgeClient]:
    server.reset()
    c = JudgeClient(server.base_url, api_key="sk-test-key-123", model="judge-model", timeout_s=2.0,
                    concurrency=4, policy=FAST)
    yield c
    await c.close()


async def test_trace_scope_asks_with_criteria_and_judge_prompt(server: JudgeServer, client: JudgeClient) -> None:
    verdict = await client.grade(QUALITY, subject())
    assert verdict.rating == 8
    request = server.requests[0]
    assert request["model"] == "judge-model" and request["temperature"] == 0
    assert request["response_format"] == {"type": "json_object"}
    assert request["_headers"]["authorization"] == "Bearer sk-test-key-123"
    question = request["messages"][-1]["content"]
    assert "Is the answer correct and helpful?" in question
    assert "Be strict about arithmetic." in question
    assert "What is 2+2?" in question and "4 [[rating=8]]" in question


async def test_session_scope_asks_the_whole_session_question_never_the_judge_prompt(
        server: JudgeServer, client: JudgeClient) -> None:
    s = subject(scope="session", transcript="--- Turn 1 ---\nUser: hi\nAgent: hello [[rating=3]]", turns=2)
    verdict = await client.grade(QUALITY, s)
    assert verdict.rating == 3
    question = server.requests[0]["messages"][-1]["content"]
    assert question.startswith(SESSION_QUESTION.split("{criteria}")[0])
    assert "Consistency across turns" in question and "was the user's need resolved" in question
    assert "Is the answer correct and helpful?" in question
    assert "Be strict about arithmetic." not in question


async def test_judge_model_overrides_the_default(server: JudgeServer, client: JudgeClient) -> None:
    await client.grade(QUALITY.model_copy(update={"model": "big-judge"}), subject())
    assert server.requests[0]["model"] == "big-judge"


async def test_429_with_retry_after_is_honoured(server: JudgeServer, client: JudgeClient) -> None:
    server.script(Behaviour.status(429, retry_after=0.4))
    started = time.monotonic()
    verdict = await client.grade(QUALITY, subject())
    assert verdict.rating == 8
    assert time.monotonic() - started >= 0.4, "waited as the server asked"
    assert len(server.requests) == 2


async def test_500s_exhaust_the_retries(server: JudgeServer, client: JudgeClient) -> None:
    server.script(*[Behaviour.status(500)] * 3)
    with pytest.raises(MemberError, match=r"judge answered HTTP 500.*\(after 3 attempts\)") as info:
        await client.grade(QUALITY, subject())
    assert info.value.retriable


async def test_retry_after_beyond_the_deadline_gives_up_at_once(server: JudgeServer, client: JudgeClient) -> None:
    server.script(Behaviour.status(429, retry_after=30))
    with pytest.raises(MemberError, match="would pass the deadline"):
        await asyncio.wait_for(client.grade(QUALITY, subject()), timeout=10)  # not 30 s of waiting
    assert len(server.requests) == 1, "no second attempt"


async def test_a_hanging_judge_times_out(server: JudgeServer) -> None:
    """The call ends as a timeout - long before the judge would answer - saying the time it was
    given (never more than the timeout), and gives its slot back: with one slot, the next call
    is made. Behaviour, not a wall-clock window a loaded machine can miss."""
    server.reset()
    server.script(Behaviour.hang(5))
    c = JudgeClient(server.base_url, api_key="sk-test-key-123", timeout_s=0.3, concurrency=1,
                    policy=RetryPolicy(attempts=1))
    try:
        started = time.monotonic()
        with pytest.raises(MemberError, match=r"^judge timed out after (\d+) ms \(after 1 attempt\)$") as error:
            await c.grade(QUALITY, subject())
        assert time.monotonic() - started < 4.5, "not the hang's 5 s: the timeout ended it"
        assert 0 <= int(re.findall(r"\d+", str(error.value))[0]) <= 300, "the time the attempt was given"
        verdict = await asyncio.wait_for(c.grade(QUALITY, subject()), timeout=4)  # the one slot is free again
        assert 0 <= verdict.rating <= 10
    finally:
        await c.close()


@pytest.mark.parametrize(("behaviour", "says"), [
    (Behaviour.content("I think it's pretty good!"), "not a JSON object"),
    (Behaviour.content('{"score": 7}'), "no numeric rating"),
    (Behaviour.rating("high"), "no numeric rating"),
    (Behaviour.rating(None), "no numeric rating"),
    (Behaviour.malformed_body(), "not a chat completion"),
])
async def test_malformed_answers_are_could_not_score(server: JudgeServer, client: JudgeClient,
                                                     behaviour: Behaviour, says: str) -> None:
    server.script(behaviour)
    with pytest.raises(MemberError, match=says):
        await client.grade(QUALITY, subject())


async def test_out_of_range_rating_is_returned_native(server: JudgeServer, client: JudgeClient) -> None:
    server.script(Behaviour.rating(11))
    assert (await client.grade(QUALITY, subject())).rating == 11  # goodness() refuses it


def test_parse_tolerates_fences_prose_and_numeric_strings() -> None:
    assert parse_verdict('```json\n{"rating": 6, "justification": "ok"}\n```').rating == 6
    assert parse_verdict('Here you go: {"rating": "7.5", "justification": "fine"} Thanks').rating == 7.5


async def test_requires_expected_without_expected_is_unscorable(client: JudgeClient, server: JudgeServer) -> None:
    exact = QUALITY.model_copy(update={"requires_expected": True})
    with pytest.raises(MemberError, match="requires an expected answer"):
        await client.grade(exact, subject())
    assert server.requests == [], "no call is made"
    await client.grade(exact, subject(expected="4"))
    assert "Expected answer:\n4" in server.requests[0]["messages"][-1]["content"]


async def test_concurrency_is_capped_per_endpoint(server: JudgeServer) -> None:
    server.reset()
    server.set_default(Behaviour.deterministic(delay=0.5))  # long enough for calls to overlap
    # One project may take both slots here (the default keeps one back for other projects).
    c = JudgeClient(server.base_url, api_key="sk-test-key-123", concurrency=2, per_project=2, policy=FAST)
    try:
        await asyncio.gather(*[c.grade(QUALITY, subject()) for _ in range(6)])
        peak = server.peak_in_flight
    finally:
        await c.close()
        server.reset()
    assert peak == 2, "two calls at once, never more (and not one at a time either)"


def test_a_retrieval_judge_reads_the_retriever_spans_outputs_of_either_shape() -> None:
    from scoring.judge_prompt import build_messages
    from scoring.subjects import Span

    judge = Judge(id="f", name="Faithful", criteria="Grounded?", context="retrieval")
    spans = (Span(span_id="root", name="agent.run", output="answer"),
             Span(span_id="a", parent_span_id="root", name="kb", kind="retriever", output={"doc": "Refunds: 30 days"}),
             Span(span_id="b", parent_span_id="root", name="tool", kind="tool", output="not context"),
             Span(span_id="c", parent_span_id="root", name="kb2", kind="retriever", output="Shipping: free"))
    asked = build_messages(judge, subject(spans=spans))[1]["content"]
    assert 'Retrieved context' in asked and '{"doc":"Refunds: 30 days"}\n---\nShipping: free' in asked
    assert "not context" not in asked
    as_dicts = [{"spanId": "a", "kind": "retriever", "output": "Refunds: 30 days"}]  # a dataset row's spans
    assert "Refunds: 30 days" in build_messages(judge, subject(spans=as_dicts))[1]["content"]
    none = build_messages(judge, subject(spans=()))[1]["content"]
    assert "(none: the trace has no retrieval step with an output)" in none
    plain = build_messages(Judge(id="h", name="Helpful", criteria="Helpful?"), subject(spans=spans))[1]["content"]
    assert "Retrieved context" not in plain, "only a judge that reads retrieval gets it"


async def test_a_cookie_the_endpoint_sets_is_never_sent_with_a_later_call() -> None:
    # One tenant's call must carry nothing another's answer left behind (a session cookie an
    # endpoint or its load balancer sets is the operator's, and each call stands alone).
    answer = {"choices": [{"message": {"role": "assistant", "content": '{"rating": 7, "reason": "ok"}'}}]}
    with ScriptedServer(Reply(body=answer, headers={"Set-Cookie": "tenant=acme-secret; Path=/"})) as endpoint:
        # By name: aiohttp's default jar keeps no cookie of a bare IP address, so the test would prove nothing.
        by_name = endpoint.url.replace("127.0.0.1", "localhost")
        c = JudgeClient(by_name, api_key="k", model="m", timeout_s=2.0, concurrency=1, policy=FAST)
        try:
            for _ in range(2):
                assert (await c.grade(QUALITY, subject())).rating == 7
        finally:
            await c.close()
    assert len(endpoint.requests) == 2
    assert "cookie" not in endpoint.requests[1].headers
