"""The local judge server, exercised over real HTTP with httpx: nothing here is mocked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devtools.judge_server import Behaviour, JudgeServer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def judge() -> Iterator[JudgeServer]:
    with JudgeServer() as server:
        yield server


def chat(text: str = "Rate this trace.", model: str = "gpt-judge") -> dict[str, Any]:
    return {"model": model, "temperature": 0, "response_format": {"type": "json_object"},
            "messages": [{"role": "system", "content": "You are a judge."},
                         {"role": "user", "content": text}]}


def post(server: JudgeServer, body: Any = None, *, timeout: float = 5.0, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{server.base_url}/chat/completions", json=chat() if body is None else body,
                      timeout=timeout, **kwargs)


def verdict(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return json.loads(response.json()["choices"][0]["message"]["content"])


# --- The deterministic default ------------------------------------------------------------

def test_default_answer_is_a_real_chat_completion_with_the_default_rating(judge: JudgeServer) -> None:
    response = post(judge, chat(model="judge-model-x"))
    completion = response.json()
    assert completion["id"].startswith("chatcmpl-")
    assert completion["object"] == "chat.completion"
    assert isinstance(completion["created"], int)
    assert completion["model"] == "judge-model-x"
    assert completion["choices"][0]["message"]["role"] == "assistant"
    assert completion["choices"][0]["finish_reason"] == "stop"
    usage = completion["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0
    assert verdict(response) == {"rating": 7.0, "justification": "Deterministic judge: rating 7"}


def test_marker_in_the_last_user_message_chooses_the_rating(judge: JudgeServer) -> None:
    assert verdict(post(judge, chat("trace: all good [[rating=3]]")))["rating"] == 3
    assert verdict(post(judge, chat("trace [[rating=8.5]] text")))["rating"] == 8.5
    # The same prompt always gets the same answer.
    assert verdict(post(judge, chat("trace [[rating=8.5]] text")))["rating"] == 8.5
    # A marker in an earlier user message does not count; content-part lists are read too.
    body = chat("[[rating=1]]")
    body["messages"] += [{"role": "assistant", "content": "ok"},
                         {"role": "user", "content": [{"type": "text", "text": "now [[rating=9]]"}]}]
    assert verdict(post(judge, body))["rating"] == 9
    body["messages"][-1] = {"role": "user", "content": "no marker"}
    assert verdict(post(judge, body))["rating"] == 7.0


def test_default_rating_is_configurable() -> None:
    with JudgeServer(default_rating=4.5) as server:
        assert verdict(post(server)) == {"rating": 4.5, "justification": "Deterministic judge: rating 4.5"}


# --- Scripted behaviours ------------------------------------------------------------------

def test_scripted_behaviours_are_used_in_order_then_the_default_resumes(judge: JudgeServer) -> None:
    fenced = '```json\n{"rating": 6, "justification": "fenced"}\n```'
    judge.script(Behaviour.rating(11, "too high"), Behaviour.rating("high"), Behaviour.content(fenced))
    judge.script(Behaviour.malformed_body())
    assert verdict(post(judge)) == {"rating": 11, "justification": "too high"}
    assert verdict(post(judge))["rating"] == "high"
    assert post(judge).json()["choices"][0]["message"]["content"] == fenced
    malformed = post(judge)
    assert malformed.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(malformed.text)
    assert verdict(post(judge, chat("[[rating=2]]")))["rating"] == 2


def test_429_carries_retry_after(judge: JudgeServer) -> None:
    judge.script(Behaviour.status(429, retry_after=2), Behaviour.status(429, retry_after=0.5))
    first, second = post(judge), post(judge)
    assert first.status_code == second.status_code == 429
    assert first.headers["Retry-After"] == "2"
    assert second.headers["Retry-After"] == "0.5"
    assert first.json()["error"]["code"] == "rate_limit_exceeded"


def test_server_errors_have_openai_style_bodies(judge: JudgeServer) -> None:
    judge.script(Behaviour.status(500), Behaviour.status(503, body={"error": {"message": "custom"}}))
    response = post(judge)
    assert response.status_code == 500
    assert "retry-after" not in response.headers
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"}
    assert error["type"] == "server_error"
    assert post(judge).json() == {"error": {"message": "custom"}}


def test_hang_times_out_its_client_without_blocking_other_requests(judge: JudgeServer) -> None:
    judge.script(Behaviour.hang(30))  # ended by the fixture's stop
    outcome: list[BaseException] = []

    def hung_request() -> None:
        try:
            post(judge, timeout=0.2)
        except httpx.TimeoutException as exc:
            outcome.append(exc)

    hung = threading.Thread(target=hung_request)
    hung.start()
    deadline = time.monotonic() + 2
    while not judge.requests and time.monotonic() < deadline:  # the hung request took its behaviour
        time.sleep(0.01)
    assert verdict(post(judge, chat("[[rating=5]]"), timeout=10))["rating"] == 5
    assert judge.peak_in_flight == 2, "answered while the hung request was still held"
    hung.join(timeout=10)
    assert len(outcome) == 1 and isinstance(outcome[0], httpx.ReadTimeout)


def test_delay_adds_latency_before_a_normal_answer(judge: JudgeServer) -> None:
    judge.script(Behaviour.rating(3).with_delay(0.2))
    started = time.monotonic()
    assert verdict(post(judge))["rating"] == 3
    assert time.monotonic() - started >= 0.2


def test_disconnect_drops_the_connection(judge: JudgeServer) -> None:
    judge.script(Behaviour.disconnect())
    with pytest.raises(httpx.RemoteProtocolError):
        post(judge)


def test_stop_ends_a_hung_request_promptly() -> None:
    server = JudgeServer().start()
    server.script(Behaviour.hang(30))
    errors: list[BaseException] = []

    def hung_request() -> None:
        try:
            post(server)
        except httpx.HTTPError as exc:
            errors.append(exc)

    client = threading.Thread(target=hung_request)
    client.start()
    deadline = time.monotonic() + 10
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.requests, "the request did not arrive"
    server.stop()
    client.join(timeout=10)
    assert not client.is_alive(), "stop ended the request held for 30 s"
    assert len(errors) == 1  # the connection was dropped, not answered


def test_stop_closes_idle_keep_alive_connections() -> None:
    server = JudgeServer().start()
    url = f"{server.base_url}/chat/completions"
    with httpx.Client(timeout=2) as client:
        assert verdict(client.post(url, json=chat()))["rating"] == 7.0  # leaves a pooled connection
        server.stop()  # returns although a client still holds an idle connection (the test's timeout bounds it)
        with pytest.raises(httpx.TransportError):  # a stopped server answers nothing
            client.post(url, json=chat())


def test_set_default_and_reset(judge: JudgeServer) -> None:
    judge.set_default(Behaviour.status(503))
    judge.script(Behaviour.rating(1))
    assert verdict(post(judge))["rating"] == 1
    assert post(judge).status_code == 503
    judge.script(Behaviour.rating(2))
    judge.reset()
    assert judge.requests == []
    assert verdict(post(judge))["rating"] == 7.0


# --- Auth, recording, and the rest of the HTTP surface ------------------------------------

def test_api_key_is_required_when_set() -> None:
    with JudgeServer(api_key="sk-test") as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            response = post(server, headers=headers)
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert verdict(post(server, headers={"Authorization": "Bearer sk-test"}))["rating"] == 7.0
        assert len(server.requests) == 1  # rejected requests are neither recorded nor scripted
        assert server.requests[0]["_headers"]["authorization"] == "Bearer sk-test"


def test_requests_are_recorded_with_bodies_and_headers(judge: JudgeServer) -> None:
    post(judge, chat("first"), headers={"X-Trace": "abc"})
    post(judge, chat("second", model="other"))
    assert [r["messages"][-1]["content"] for r in judge.requests] == ["first", "second"]
    first = judge.requests[0]
    assert first["model"] == "gpt-judge"
    assert first["response_format"] == {"type": "json_object"}
    assert first["temperature"] == 0
    assert first["_headers"]["x-trace"] == "abc"
    assert first["_headers"]["content-type"] == "application/json"


def test_calls_are_counted_by_the_key_marker_of_the_last_user_message(judge: JudgeServer) -> None:
    for text in ("t-1 [[key=t-1]] [[rating=3]]", "again [[key=t-1]]", "[[key=old]] then [[key=t-2]]", "no key"):
        assert post(judge, chat(text)).status_code == 200
    body = chat("[[key=t-3]]")
    body["messages"].append({"role": "user", "content": "the last user message has none"})
    post(judge, body)
    assert judge.calls_by_key == {"t-1": 2, "t-2": 1}, "the last marker of the last user message counts"
    judge.reset()
    assert judge.calls_by_key == {}


def test_models_unknown_paths_and_bad_request_bodies(judge: JudgeServer) -> None:
    models = httpx.get(f"{judge.base_url}/models", timeout=5)
    assert models.status_code == 200 and models.json()["object"] == "list" and models.json()["data"]
    assert httpx.get(f"{judge.base_url}/nope", timeout=5).json()["error"]["code"] == "not_found"
    assert httpx.post(f"{judge.base_url}/embeddings", json={}, timeout=5).status_code == 404
    bad = httpx.post(f"{judge.base_url}/chat/completions", content=b"{not json", timeout=5)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    assert post(judge, {"model": "m"}).status_code == 400  # no messages
    assert judge.requests == []


def test_runs_as_a_process_and_exits_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "devtools.judge_server", "--port", "0"], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("judge server listening on http://127.0.0.1:") and line.endswith("/v1")
        base_url = line.rsplit(" ", 1)[1]
        response = httpx.post(f"{base_url}/chat/completions", json=chat("[[rating=6]]"), timeout=5)
        assert verdict(response)["rating"] == 6
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=3) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_model_marker_rates_only_requests_for_that_model() -> None:
    with JudgeServer(default_rating=5) as server:
        text = "answer [[rating=4]] [[rating@safety-model=9]]"

        def ask(model: str) -> float:
            body = {"model": model, "messages": [{"role": "user", "content": text}]}
            reply = httpx.post(server.base_url + "/chat/completions", json=body, timeout=5).json()
            return float(json.loads(reply["choices"][0]["message"]["content"])["rating"])

        assert ask("safety-model") == 9, "the model's own marker wins"
        assert ask("quality-model") == 4, "other models read the plain marker"
