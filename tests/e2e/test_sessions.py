"""Session scope end to end: conversations judged once quiet, by the whole transcript and the
speaker split; a stable per-conversation sample; judged again when they grow; verdicts readable
through sessions.scores; Signals below threshold, like trace scope."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from devtools.judge_server import JudgeServer
from services.groups import MonitorClient
from tests.support.harness import WorkerProcess, produce, read_topic
from tests.support.redis_clients import connect
from tests.support.sampling_reference import reference_keep

SESSION = {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6, "severity": "high",
           "scope": "session", "idleSeconds": 1}
CATALOG = {
    "judges": [{"id": "tone", "name": "Tone", "criteria": "Polite and consistent?"}],
    "patterns": [{"id": "apology", "name": "Apology", "polarity": "failure", "template": "apology"}],
    "groups": [
        {"id": "conv", "name": "Conversation", "projectId": "p-s", "online": SESSION,
         "members": [{"kind": "judge", "refId": "tone", "weight": 1, "gate": False},
                     {"kind": "pattern", "refId": "apology", "weight": 0, "gate": True}]},
        {"id": "conv-half", "name": "Half", "projectId": "p-s", "online": {**SESSION, "sampleRate": 0.5},
         "members": [{"kind": "judge", "refId": "tone", "weight": 1, "gate": False}]},
    ],
}


def turn(session: str, n: int, user: str, agent: str) -> dict[str, Any]:
    return {"traceId": f"{session}-t{n}", "projectId": "p-s", "agentId": "agent-s", "sessionId": session,
            "timestamp": f"2026-12-02T13:00:{n:02d}Z",
            "spans": [{"spanId": "r", "name": "agent.run", "input": user, "output": agent}]}


CONVERSATIONS = {
    "s-good": [turn("s-good", 1, "Hi, my order is late", "Let me check that for you."),
               turn("s-good", 2, "It was #12", "It ships today. [[rating=8]]"),
               turn("s-good", 3, "Thanks", "You're welcome!")],
    "s-sorry": [turn("s-sorry", 1, "Where is it?", "I'm sorry about the delay."),
                turn("s-sorry", 2, "ok", "It arrives Friday. [[rating=9]]")],
    "s-user-sorry": [turn("s-user-sorry", 1, "Sorry to bother you, I'm sorry", "No problem at all."),
                     turn("s-user-sorry", 2, "Can you help?", "Of course. [[rating=7]]")],
    "s-single": [turn("s-single", 1, "Hello?", "Hi! [[rating=2]]")],
}
SESSIONS = [f"s-{i}" for i in range(12)]  # more conversations, for the per-conversation sample


# env (tests/e2e/conftest.py): a worker's environment with this catalog and these settings
pytestmark = [pytest.mark.integration, pytest.mark.worker(CATALOG, session_sweep_interval_s=0.3,
                                                          commit_interval_s=0.2)]


def records(turns: list[dict[str, Any]]) -> list[tuple[bytes | None, bytes]]:
    return [(t["traceId"].encode(), orjson.dumps(t)) for t in turns]


async def test_sessions_are_judged_once_quiet_and_again_when_they_grow(
        env: dict[str, str], kafka_bootstrap: str, judge: JudgeServer, tmp_path: Path) -> None:
    extra = {s: [turn(s, 1, "q", "a [[rating=5]]"), turn(s, 2, "q", "a")] for s in SESSIONS}
    worker = WorkerProcess(env).start(tmp_path)
    try:
        worker.wait_ready()
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                      records([t for c in [*CONVERSATIONS.values(), *extra.values()] for t in c]))
        judged = {s for s in [*CONVERSATIONS, *SESSIONS] if s != "s-single"}
        half = {s for s in judged if reference_keep(s, 0.5)}
        expected = len(judged) + len(half)
        first = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"], until=lambda v: len(v) >= expected,
                                 timeout_s=60, settle_s=2.5)
        # The conversation grows: it is judged again, on all four turns.
        await produce(kafka_bootstrap, env["SGW_TRACES_TOPIC"],
                      records([turn("s-good", 4, "Actually it did not ship", "That is not my problem. [[rating=3]]")]))
        grown = 1 + ("s-good" in half)
        everything = await read_topic(kafka_bootstrap, env["SGW_RATINGS_TOPIC"],
                                      until=lambda v: len(v) >= expected + grown, timeout_s=60, settle_s=2.5)
        signals = await read_topic(kafka_bootstrap, env["SGW_SIGNALS_TOPIC"], until=lambda v: True, settle_s=1)
        redis = connect(env["SGW_REDIS_URL"])
        scores = await MonitorClient(redis).sessions.scores("s-good")
        await redis.aclose()
    finally:
        assert worker.stop() == 0, worker.logs()

    assert all(r["scope"] == "session" for r in everything), "session groups never rate single traces"
    pairs = Counter((r["groupId"], r["sessionId"]) for r in first)
    assert max(pairs.values()) == 1, "each quiet conversation judged once per group"
    assert {s for g, s in pairs if g == "conv"} == judged, "2+ turns only: s-single is never judged"
    assert {s for g, s in pairs if g == "conv-half"} == half, "a stable per-conversation sample"
    assert 0 < len(half) < len(judged)

    conv = {r["sessionId"]: r for r in first if r["groupId"] == "conv"}
    assert conv["s-good"]["rating"] == 8.0 and conv["s-good"]["turns"] == 3
    assert conv["s-sorry"]["rating"] == 0.0, "an apology anywhere on the agent side zeroes the conversation"
    assert conv["s-user-sorry"]["rating"] == 7.0, "the user's own apologies are not the agent's"
    session_question = [r["messages"][-1]["content"] for r in judge.requests
                        if "It ships today" in r["messages"][-1]["content"]]
    assert session_question and "Conversation (3 turns)" in session_question[0]
    assert "Consistency across turns" in session_question[0]

    regrown = [r for r in everything[len(first):] if r["groupId"] == "conv"]
    assert [(r["sessionId"], r["turns"], r["rating"]) for r in regrown] == [("s-good", 4, 3.0)]
    below = {r["id"] for r in everything if r["rating"] is not None and r["rating"] < 6}
    assert {s["ratingId"] for s in signals} == below and len(signals) == len(below)
    assert {s["sessionId"] for s in signals if s["groupId"] == "conv"} >= {"s-sorry", "s-good"}
    assert any(s["rating"] == 3.0 and s["key"] == "scorer-group:conv" for s in signals)
    latest = {s["kind"]: s for s in scores}
    assert latest["scorer-group:conv"]["rating"] == 3.0, "sessions.scores returns the latest verdict"
    assert latest["scorer-group:conv"]["justification"].startswith("Weighted blend:")
