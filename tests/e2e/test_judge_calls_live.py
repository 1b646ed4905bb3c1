"""The judge calls behind a live verdict, read back through the API: the exact messages the
local judge received and its answer, with latency, attempts and tokens; a secret in the trace
(the operator's own judge key, sent by a hostile tenant) masked; long texts cut at the bound
with their full length; another project's rating a 404."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from deploy.judge_server import JudgeServer
from scorer_groups import Client, NotFound
from scorer_groups.api_models import RatingWithCalls
from scoring.judge_calls import CALL_TEXT_MAX_CHARS
from tests.support.api_process import ApiProcess, create_key
from tests.support.harness import WorkerProcess, produce, read_topic, worker_env

pytestmark = pytest.mark.integration

JUDGE_KEY = "sk-operator-judge-key-0f1e2d3c4b5a"


def trace(trace_id: str, output: str) -> tuple[bytes, bytes]:
    value = {"traceId": trace_id, "projectId": "p-calls", "agentId": "bot", "timestamp": "2026-12-05T09:00:00Z",
             "spans": [{"spanId": "r", "parentSpanId": None, "name": "agent.run", "input": "Where is my order?",
                        "output": output}]}
    return trace_id.encode(), orjson.dumps(value)


def kept_result(client: Client, group_id: str, rating_id: str) -> RatingWithCalls:
    """The result once the worker has kept it: it publishes a rating first, then records it."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return client.monitor.scorer_groups.result(group_id, rating_id)
        except NotFound:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


async def test_a_live_verdicts_judge_calls_are_readable_exactly_cut_and_masked(
        redis_db_url: str, kafka_bootstrap: str, unique: str, tmp_path: Path) -> None:
    with JudgeServer(api_key=JUDGE_KEY) as judge:
        env = worker_env(kafka_bootstrap, redis_db_url, unique, topic_partitions=1,
                         judge_base_url=judge.base_url, judge_api_key=JUDGE_KEY)
        api = ApiProcess(redis_db_url, tmp_path / "api.log").start()
        worker = WorkerProcess(env).start(tmp_path)
        try:
            worker.wait_ready()
            with Client(api.url, create_key(redis_db_url, "--project", "p-calls")) as client:
                helpful = client.monitor.judges.create(name="Helpful", criteria="Is the answer helpful?")
                group = client.monitor.scorer_groups.create(
                    "Support", members=[{"kind": "judge", "refId": helpful.id, "weight": 1, "label": "Helpfulness"}],
                    online={"enabled": True, "sampleRate": 1.0, "alertThreshold": 5, "severity": "high"})
                long_output = "It ships today. " + "z" * 9_000 + f" my key is {JUDGE_KEY} [[rating=8]]"
                await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                              [trace("t-short", "It ships today. [[rating=6]]"), trace("t-long", long_output)])
                ratings = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                           until=lambda v: {r["traceId"] for r in v} >= {"t-short", "t-long"})
                by_trace = {r["traceId"]: r for r in ratings}

                short = kept_result(client, group.id, by_trace["t-short"]["id"])
                assert short.rating.rating == 6.0 and short.rating.trace_id == "t-short"
                (record,) = short.calls
                sent = next(r for r in judge.requests if "It ships today. [[rating=6]]" in str(r["messages"]))
                assert [(m.role, m.content) for m in record.messages] == \
                    [(m["role"], m["content"]) for m in sent["messages"]], "the exact messages the judge received"
                assert all(m.length == len(m.content) for m in record.messages)
                assert (record.ref_id, record.member, record.model) == (helpful.id, "Helpfulness", sent["model"])
                assert record.answer is not None and orjson.loads(record.answer)["rating"] == 6
                assert record.attempts == 1 and record.latency_ms > 0 and record.error is None
                assert record.usage is not None and record.usage.prompt_tokens and record.usage.completion_tokens

                long = kept_result(client, group.id, by_trace["t-long"]["id"])
                user = long.calls[0].messages[1]
                assert len(user.content) == CALL_TEXT_MAX_CHARS and user.length > 9_000, "cut, its length said"
                sent_long = next(r for r in judge.requests if "z" * 100 in str(r["messages"]))
                assert JUDGE_KEY in sent_long["messages"][1]["content"], "the judge itself saw the trace as sent"
                kept = orjson.dumps(long.model_dump(by_alias=True, mode="json")).decode()
                assert JUDGE_KEY not in kept and JUDGE_KEY[:12] not in kept, "the operator's key never comes back"

                with pytest.raises(NotFound):
                    client.monitor.scorer_groups.result(group.id, "00000000-0000-5000-8000-000000000000")
            with Client(api.url, create_key(redis_db_url, "--project", "p-stranger")) as stranger:
                with pytest.raises(NotFound):
                    stranger.monitor.scorer_groups.result(group.id, by_trace["t-short"]["id"])
        finally:
            worker.stop()
            api.stop()
