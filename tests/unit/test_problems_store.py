"""A request whose store is unreachable or whose process's Redis pool stays full is a 503 with
Retry-After (the SDK asks again), never a 500; any other Redis answer is a 500 that says nothing."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.stores.client import PoolBusy
from worker.api import problems

RAISED = {"busy": PoolBusy("every one of the 8 Redis connections stayed in use for 5s"),
          "down": RedisConnectionError("Error 111 connecting to 10.0.0.7:6379. Connection refused."),
          "frozen": RedisTimeoutError("Timeout reading from socket"),
          "bug": ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")}


def client() -> TestClient:
    app = FastAPI()
    problems.install(app)

    @app.get("/raise/{name}")
    async def raise_it(name: str) -> None:
        raise RAISED[name]

    return TestClient(app, raise_server_exceptions=False)


def test_an_unreachable_or_busy_store_is_a_503_to_retry_and_names_no_address() -> None:
    http = client()
    for name in ("busy", "down", "frozen"):
        answer = http.get(f"/raise/{name}")
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1", (name, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert "10.0.0.7" not in answer.text and "connections" not in answer.text


def test_any_other_redis_answer_is_a_500_that_says_nothing_of_it() -> None:
    answer = client().get("/raise/bug")
    assert answer.status_code == 500 and "WRONGTYPE" not in answer.text and "retry-after" not in answer.headers
