"""Spend only what a verdict needs, on the real Redis and a real chat-completions server:
``gatesFirst`` calls no judge once a cheap must-pass member failed (and reserves nothing for
them), every retry of a judge call takes a budget slot before it is made, and each verdict
carries the tokens the judge API reported."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from adapters.members.http import RetryPolicy
from adapters.members.judge import JudgeClient
from adapters.stores.claims import Claims
from devtools.judge_server import Behaviour, JudgeServer
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import day_of
from scoring.judge_prompt import ANSWER_MAX_TOKENS
from scoring.models import Budget, Judge, Pattern, ScorerGroup
from scoring.panel import Panel
from scoring.ports import BudgetExhausted, TokenUsage
from scoring.results import build_rating, tokens_of
from scoring.routing import Pair, pair_of
from tests.support.panel_catalog import subject

pytestmark = pytest.mark.integration

NOW = 1_796_221_800.0
FAST = RetryPolicy(attempts=3, backoff_base_s=0.01, backoff_cap_s=0.02)
LEAK = "Write to me at jane@example.com"
CLEAN = "Here is the plan you asked for."

Counted = list[tuple[str, TokenUsage]]


@pytest.fixture
async def panel(judge_server: JudgeServer) -> AsyncIterator[tuple[Panel, Counted]]:
    judge_server.reset()
    counted: Counted = []
    judges = JudgeClient(judge_server.base_url, timeout_s=5, policy=FAST)
    yield Panel(judges=judges, member_deadline_s=10, count_tokens=lambda p, u: counted.append((p, u))), counted
    await judges.close()


def catalog(project: str, *, gates_first: bool, budget: int | None = None, judges: int = 3,
            tokens: int | None = None) -> CatalogSnapshot:
    """A free PII pattern that must pass, and judges: the issue's example group."""
    group = ScorerGroup.model_validate({
        "id": "g", "name": "Release bar", "projectId": project, "gatesFirst": gates_first,
        "members": [{"kind": "pattern", "refId": "pii", "weight": 0, "gate": True},
                    *({"kind": "judge", "refId": f"j{i}"} for i in range(1, judges + 1))],
        "online": {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}})
    return CatalogSnapshot(
        version=1, groups={"g": group},
        judges={f"j{i}": Judge(id=f"j{i}", name=f"Judge {i}", criteria="Helpful?") for i in range(1, judges + 1)},
        patterns={"pii": Pattern(id="pii", name="PII", polarity="failure", template="email")},
        budgets={} if budget is None and tokens is None else {project: Budget(
            project_id=project, judge_calls_per_window=100 if budget is None else budget,
            judge_tokens_per_window=tokens)})


def live_pair(snap: CatalogSnapshot, output: str, trace: str) -> Pair:
    group = snap.groups["g"]
    return pair_of(group, subject(output, trace_id=trace, project_id=group.project_id), snap,
                   subject_key=f"trace:{trace}", day=day_of(NOW))


def sent_ceiling(request: dict[str, Any]) -> int:
    """A call's token ceiling, from the request the judge server received and the ceiling's
    definition (docs/running.md): the UTF-8 bytes of its messages, 8 per message for the chat
    format, and the answer's max_tokens."""
    max_tokens: int = request["max_tokens"]
    return sum(len(m["content"].encode()) + 8 for m in request["messages"]) + max_tokens


def words_reported(request: dict[str, Any], answer: str) -> int:
    """The tokens the local judge server reports for one answered call: it counts words, the
    prompt's and its answer's."""
    return sum(len(str(m["content"]).split()) for m in request["messages"]) + len(answer.split())


async def claimed(claims: Claims, pair: Pair) -> None:
    (result,) = await claims.claim_many([pair.claim])
    assert result.state == "claimed"


async def test_gates_first_calls_no_judge_when_a_cheap_gate_fails(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    claims, snap = Claims(redis), catalog(f"p-{unique}", gates_first=True)
    pair = live_pair(snap, LEAK, "t-leak")
    assert pair.claim.judge_calls == 0, "the claim reserves nothing for judges that may not be called"
    await claimed(claims, pair)

    result = await scorer.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))

    assert judge_server.requests == [], "no judge call for a trace whose cheap gate failed"
    assert result.rating == 0.0 and result.blend.reason == 'Must-pass member "PII" failed (goodness 0.00 < 0.5)'
    judges = [m for m in result.blend.members if m.outcome.kind == "judge"]
    assert [m.status for m in judges] == ["skipped"] * 3
    assert all(m.outcome.skipped == 'not called: must-pass member "PII" failed first (gatesFirst)' for m in judges)
    rating = json.loads(build_rating(result, "trace").to_json())
    assert [(m["status"], m["detail"]) for m in rating["members"][1:]] == [
        ("skipped", 'not called: must-pass member "PII" failed first (gatesFirst)')] * 3
    assert "Judge 1 skipped (not called" in rating["justification"]
    assert await claims.budget_used(f"p-{unique}", 3600) == 0, "budget only for the judge calls made"


async def test_gates_first_reserves_the_judges_once_the_gates_passed(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    claims, snap = Claims(redis), catalog(f"p-{unique}", gates_first=True, budget=10)
    pair = live_pair(snap, CLEAN, "t-clean")
    await claimed(claims, pair)

    result = await scorer.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))

    assert len(judge_server.requests) == 3 and result.rating == 7.0
    assert [m.status for m in result.blend.members] == ["scored"] * 4
    assert await claims.budget_used(f"p-{unique}", 3600) == 3


async def test_gates_first_with_no_room_for_its_judges_skips_the_group_whole(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    claims, snap = Claims(redis), catalog(f"p-{unique}", gates_first=True, budget=2)
    pair = live_pair(snap, CLEAN, "t-starved")
    await claimed(claims, pair)

    with pytest.raises(BudgetExhausted):
        await scorer.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))

    assert judge_server.requests == [], "never a partial panel"
    assert await claims.budget_used(f"p-{unique}", 3600) == 0
    assert await claims.stored(pair.claim) == "skipped:budget", "a redelivery is not scored again"
    (again,) = await claims.claim_many([pair.claim])
    assert again.state == "skipped"


async def test_without_gates_first_every_member_runs(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    claims, snap = Claims(redis), catalog(f"p-{unique}", gates_first=False)
    pair = live_pair(snap, LEAK, "t-spec")
    assert pair.claim.judge_calls == 3, "the spec's behaviour: reserved up front, every member runs"
    await claimed(claims, pair)

    result = await scorer.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))

    assert len(judge_server.requests) == 3 and result.rating == 0.0
    assert [m.status for m in result.blend.members] == ["scored"] * 4


async def test_a_retried_judge_call_takes_two_slots(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    claims, snap = Claims(redis), catalog(f"p-{unique}", gates_first=False, budget=5, judges=1)
    pair = live_pair(snap, CLEAN, "t-retry")
    await claimed(claims, pair)
    judge_server.script(Behaviour.status(503))

    result = await scorer.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))

    assert len(judge_server.requests) == 2 and result.rating == 7.0
    assert await claims.budget_used(f"p-{unique}", 3600) == 2, "one slot per HTTP call made"


async def test_a_retry_with_no_slot_left_is_not_made(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    claims, snap = Claims(redis), catalog(f"p-{unique}", gates_first=False, budget=1, judges=1)
    pair = live_pair(snap, CLEAN, "t-no-retry")
    await claimed(claims, pair)
    judge_server.script(Behaviour.status(503))

    result = await scorer.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))

    assert len(judge_server.requests) == 1, "the retry was refused before it was made"
    judge = result.blend.members[1]
    assert judge.status == "failed" and judge.outcome.error is not None
    assert "budget exhausted before retry" in judge.outcome.error and "HTTP 503" in judge.outcome.error
    assert await claims.budget_used(f"p-{unique}", 3600) == 1


async def test_each_verdict_carries_the_tokens_its_judge_reported(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, unique: str) -> None:
    scorer, counted = panel
    snap = catalog(f"p-{unique}", gates_first=False, judges=2)
    bare = {"id": "c", "object": "chat.completion", "created": 0, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant",
                                                 "content": '{"rating": 6, "justification": "ok"}'},
                         "finish_reason": "stop"}]}
    judge_server.script(Behaviour.rating(8), Behaviour.status(200, body=bare))  # the second: no usage

    result = await scorer.score(snap.groups["g"], subject(CLEAN, project_id=f"p-{unique}"), snap)

    requests = judge_server.requests
    rating = json.loads(build_rating(result, "trace").to_json())
    with_usage = [m for m in rating["members"] if "usage" in m]
    assert len(with_usage) == 1, "usage where the API returned it, and absent where it did not"
    prompt = sum(len(str(m["content"]).split()) for m in requests[0]["messages"])
    # The local server counts words: its answer's and the prompt's (both judges ask the same).
    completion = len(json.dumps({"rating": 8, "justification": "Scripted judge answer"}).split())
    assert with_usage[0]["usage"] == {"promptTokens": prompt, "completionTokens": completion, "cost": None}
    assert with_usage[0]["native"] == 8
    assert [u for _, u in counted] == [TokenUsage(prompt, completion)] and counted[0][0] == f"p-{unique}"


async def test_a_token_budget_reserves_each_calls_ceiling_and_settles_to_the_real_usage(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    project = f"p-{unique}"
    claims, snap = Claims(redis), catalog(project, gates_first=False, judges=2, tokens=100_000)
    pair = live_pair(snap, CLEAN, "t-tokens")
    ceiling = pair.claim.judge_tokens
    assert ceiling > 2 * ANSWER_MAX_TOKENS, "the ceiling: prompt bytes and max_tokens"
    await claimed(claims, pair)
    assert await claims.tokens_used(project, 3600) == ceiling, "reserved before the calls"

    judge_server.script(Behaviour.rating(8), Behaviour.rating(8))
    spend = claims.spend(pair.claim)
    result = await scorer.score(pair.group, pair.subject, snap, spend=spend)
    requests = judge_server.requests
    assert len(requests) == 2 and ceiling == sum(sent_ceiling(r) for r in requests), "each call's ceiling, reserved"
    answer = json.dumps({"rating": 8, "justification": "Scripted judge answer"})
    reported = sum(words_reported(r, answer) for r in requests)  # what the judge API said the calls cost
    assert tokens_of(result) == reported and 0 < reported < ceiling
    await claims.mark_done([(pair.claim, "r-1")], settled=spend.settlements(reported, None))

    assert await claims.tokens_used(project, 3600) == reported, "settled to the usage the judges reported"
    assert all(r["max_tokens"] == ANSWER_MAX_TOKENS for r in judge_server.requests), "the answer is bounded"


async def test_a_token_budget_without_room_for_the_ceiling_skips_the_group(redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    claims, snap = Claims(redis), catalog(project, gates_first=False, judges=2, tokens=1_000)  # under two answers' max_tokens
    (result,) = await claims.claim_many([live_pair(snap, CLEAN, "t-poor").claim])
    assert result.state == "exhausted"
    assert await claims.tokens_used(project, 3600) == 0 and await claims.budget_used(project, 3600) == 0


async def test_without_a_token_budget_tokens_are_counted_not_reserved(
        panel: tuple[Panel, Counted], redis: Redis, unique: str) -> None:
    scorer, _ = panel
    project = f"p-{unique}"
    claims, snap = Claims(redis), catalog(project, gates_first=False, judges=2)
    pair = live_pair(snap, CLEAN, "t-count")
    assert pair.claim.judge_tokens == 0, "no prompt is measured without a token budget"
    await claimed(claims, pair)
    spend = claims.spend(pair.claim)
    result = await scorer.score(pair.group, pair.subject, snap, spend=spend)
    await claims.mark_done([(pair.claim, "r-2")], settled=spend.settlements(tokens_of(result), None))
    assert await claims.tokens_used(project, 3600) == tokens_of(result) > 0


async def test_under_a_token_budget_deferred_judges_and_retries_reserve_their_ceilings(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    project = f"p-{unique}"
    snap = catalog(project, gates_first=True, judges=2, budget=10, tokens=1_000_000)
    claims, pair = Claims(redis), live_pair(snap, CLEAN, "t-ceilings")
    assert (pair.claim.judge_calls, pair.claim.judge_tokens) == (0, 0), "deferred: nothing up front"
    await claimed(claims, pair)
    judge_server.script(Behaviour.status(503))  # one of the two judges is retried once
    spend = claims.spend(pair.claim)
    result = await scorer.score(pair.group, pair.subject, snap, spend=spend)

    assert len(judge_server.requests) == 3 and result.rating == 7.0
    one = sent_ceiling(judge_server.requests[0])
    assert all(sent_ceiling(r) == one for r in judge_server.requests), "both judges ask the same"
    assert await claims.budget_used(project, 3600) == 3, "two judges once their gate passed, one retry"
    assert await claims.tokens_used(project, 3600) == spend.tokens_reserved == 3 * one
    await claims.mark_done([(pair.claim, "r")], settled=spend.settlements(tokens_of(result), None))
    assert await claims.tokens_used(project, 3600) == tokens_of(result), "settled to the usage"


async def test_a_gates_first_judge_is_retried_on_a_slot_of_its_own(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    claims, snap = Claims(redis), catalog(f"p-{unique}", gates_first=True, budget=2, judges=1)
    pair = live_pair(snap, CLEAN, "t-gated-retry")
    await claimed(claims, pair)
    judge_server.script(Behaviour.status(503), Behaviour.status(503))
    result = await scorer.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))
    assert len(judge_server.requests) == 2, "the panel's slot, one retry's, and no third call"
    assert "budget exhausted before retry" in (result.blend.members[1].outcome.error or "")


async def test_a_judge_off_its_scale_keeps_the_usage_it_cost(panel: tuple[Panel, Counted], judge_server: JudgeServer,
                                                              unique: str) -> None:
    scorer, counted = panel
    snap = catalog(f"p-{unique}", gates_first=False, judges=1)
    judge_server.script(Behaviour.rating(12))
    result = await scorer.score(snap.groups["g"], subject(CLEAN, project_id=f"p-{unique}"), snap)
    judge = result.blend.members[1]
    assert judge.status == "failed" and "within 0-10" in (judge.outcome.error or "")
    assert judge.outcome.usage is not None and judge.outcome.usage.prompt_tokens
    assert len(counted) == 1


async def test_a_skipped_judge_whose_scorer_is_gone_is_named_by_its_reference(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, unique: str) -> None:
    scorer, _ = panel
    snap = catalog(f"p-{unique}", gates_first=True, judges=1)
    gone = CatalogSnapshot(version=2, groups=snap.groups, patterns=snap.patterns)  # the judge was deleted
    result = await scorer.score(snap.groups["g"], subject(LEAK, project_id=f"p-{unique}"), gone)
    assert [(m.outcome.name, m.status) for m in result.blend.members] == [("PII", "scored"), ("j1", "skipped")]


async def test_a_retry_under_a_token_budget_reserves_one_judges_ceiling(
        panel: tuple[Panel, Counted], judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    scorer, _ = panel
    project = f"p-{unique}"
    snap = catalog(project, gates_first=False, judges=1, budget=10, tokens=1_000_000)
    claims, pair = Claims(redis), live_pair(snap, CLEAN, "t-retry-tokens")
    one = pair.claim.judge_tokens
    await claimed(claims, pair)
    judge_server.script(Behaviour.status(503))
    spend = claims.spend(pair.claim)
    await scorer.score(pair.group, pair.subject, snap, spend=spend)
    assert [sent_ceiling(r) for r in judge_server.requests] == [one, one], "the call and its retry, one ceiling each"
    assert await claims.tokens_used(project, 3600) == spend.tokens_reserved == 2 * one


async def test_a_gates_first_judge_that_needs_an_expected_answer_is_not_reserved_without_one(
        judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    judge_server.reset()
    project = f"p-{unique}"
    base = catalog(project, gates_first=True, budget=5, judges=1)
    exact = Judge(id="j1", name="Exact", criteria="The expected answer?", requires_expected=True)
    snap = CatalogSnapshot(version=1, groups=base.groups, judges={"j1": exact}, patterns=base.patterns,
                           budgets=base.budgets)
    observed: list[tuple[str, str]] = []
    scorer = Panel(judges=JudgeClient(judge_server.base_url, timeout_s=5, policy=FAST), member_deadline_s=10,
                   observe=lambda kind, status, reason, seconds: observed.append((kind, status)))
    claims, pair = Claims(redis), live_pair(snap, CLEAN, "t-exact")
    await claimed(claims, pair)
    leak = live_pair(snap, LEAK, "t-exact-leak")
    await claimed(claims, leak)
    try:
        result = await scorer.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))
        assert judge_server.requests == [] and await claims.budget_used(project, 3600) == 0
        assert result.blend.members[1].outcome.error == "judge requires an expected answer and this subject has none"
        observed.clear()
        skipped = await scorer.score(leak.group, leak.subject, snap, spend=claims.spend(leak.claim))
    finally:
        await scorer._judges.close()  # type: ignore[union-attr]
    assert [m.status for m in skipped.blend.members] == ["scored", "skipped"]
    assert observed == [("pattern", "scored"), ("judge", "skipped")], "a skipped member is observed too"
