"""Budgets in money, on the real Redis and a real chat-completions server: a project's
``judgeCostPerWindow`` and a group's ``online.maxCostPerDay`` reserve each call's cost ceiling -
its token ceiling at its model's price - all or nothing, and settle to what the calls cost at the
tokens the judge API reported; a model without a price is refused under a money cap, never free;
a project key may only lower the operators' cap."""

from __future__ import annotations

import json
import math
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
from scoring.errors import Forbidden
from scoring.models import Budget, Judge, Pattern, ScorerGroup
from scoring.panel import Panel
from scoring.prices import Price, Pricing
from scoring.results import cost_of
from scoring.routing import Pair, pair_of
from services.groups import Caller, budget_write
from tests.support.panel_catalog import subject

pytestmark = pytest.mark.integration

NOW = 1_796_221_800.0
FAST = RetryPolicy(attempts=3, backoff_base_s=0.01, backoff_cap_s=0.02)
MODEL = "gpt-4o-mini"  # the judge client's default model
PRICING = Pricing({MODEL: Price(input=2.0, output=10.0)}, MODEL)  # per million tokens
CLEAN = "Here is the plan you asked for."


@pytest.fixture
async def panel(judge_server: JudgeServer) -> AsyncIterator[Panel]:
    judge_server.reset()
    judges = JudgeClient(judge_server.base_url, timeout_s=5, policy=FAST, prices=PRICING.prices)
    yield Panel(judges=judges, member_deadline_s=10, pricing=PRICING)
    await judges.close()


def catalog(project: str, *, cost: float | None = None, per_day: float | None = None, judges: int = 3,
            gates_first: bool = False, model: str | None = None, second_group: bool = False) -> CatalogSnapshot:
    online: dict[str, Any] = {"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high"}
    if per_day is not None:
        online["maxCostPerDay"] = per_day
    members = [{"kind": "pattern", "refId": "pii", "weight": 0, "gate": True},
               *({"kind": "judge", "refId": f"j{i}"} for i in range(1, judges + 1))]
    groups = {"g": ScorerGroup.model_validate({"id": "g", "name": "Release bar", "projectId": project,
                                              "gatesFirst": gates_first, "members": members, "online": online})}
    if second_group:  # the same rubric without a cap of its own
        groups["h"] = ScorerGroup.model_validate({"id": "h", "name": "Other", "projectId": project,
                                                 "members": members, "online": {**online, "maxCostPerDay": None}})
    return CatalogSnapshot(
        version=1, groups=groups,
        judges={f"j{i}": Judge(id=f"j{i}", name=f"Judge {i}", criteria="Helpful?", model=model)
                for i in range(1, judges + 1)},
        patterns={"pii": Pattern(id="pii", name="PII", polarity="failure", template="email")},
        budgets={project: Budget(project_id=project, judge_calls_per_window=1000, judge_cost_per_window=cost)})


def live_pair(snap: CatalogSnapshot, trace: str, group: str = "g") -> Pair:
    g = snap.groups[group]
    return pair_of(g, subject(CLEAN, trace_id=trace, project_id=g.project_id), snap,
                   subject_key=f"trace:{trace}", day=day_of(NOW), pricing=PRICING)


def ceiling_nanos(request: dict[str, Any]) -> int:
    """One call's cost ceiling from the request the judge server received: its token ceiling
    (the messages' UTF-8 bytes, 8 per message, the answer's max_tokens) at the input price, and
    the answer's max_tokens again at the rest of the output price - in nanos."""
    tokens = sum(len(m["content"].encode()) + 8 for m in request["messages"]) + request["max_tokens"]
    return tokens * 2_000 + request["max_tokens"] * 8_000  # $2 and $10 per million: 2,000 and 10,000 nanos a token


def cost_nanos(request: dict[str, Any], answer: str) -> int:
    """What one answered call cost: the local server reports words as tokens."""
    prompt = sum(len(str(m["content"]).split()) for m in request["messages"])
    return math.ceil((prompt * 2.0 + len(answer.split()) * 10.0) / 1e6 * 1e9 - 1e-6)


async def test_a_money_cap_reserves_each_calls_cost_ceiling_and_settles_to_what_it_cost(
        panel: Panel, judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    claims, snap = Claims(redis), catalog(project, cost=5.0)
    pair = live_pair(snap, "t-money")
    (state,) = await claims.claim_many([pair.claim])
    assert state.state == "claimed" and state.cost == pair.claim.cost(3, pair.claim.judge_tokens) > 0
    reserved = await claims.cost_used(project, 3600)
    assert reserved == state.cost, "the ceiling, reserved before any call"

    judge_server.script(*(Behaviour.rating(8) for _ in range(3)))
    spend = claims.spend(pair.claim)
    result = await panel.score(pair.group, pair.subject, snap, spend=spend)
    requests = judge_server.requests
    assert len(requests) == 3 and reserved == sum(ceiling_nanos(r) for r in requests), "each call's ceiling"
    answer = json.dumps({"rating": 8, "justification": "Scripted judge answer"})
    cost = sum(cost_nanos(r, answer) for r in requests)
    assert cost_of(result) == cost and 0 < cost < reserved
    await claims.mark_done([(pair.claim, "r-1")], settled=spend.settlements(0, cost_of(result)))
    assert await claims.cost_used(project, 3600) == cost, "settled to the calls' exact cost"


async def test_a_money_cap_skips_the_pair_that_would_pass_it_whole(redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    one = live_pair(catalog(project, cost=1.0), "t-probe").claim
    per_pair = one.cost(one.judge_calls, one.judge_tokens)
    claims, snap = Claims(redis), catalog(project, cost=(2 * per_pair + per_pair // 2) / 1e9)  # room for 2.5 pairs
    batch = [live_pair(snap, f"t-{i}").claim for i in range(3)]
    states = [s.state for s in await claims.claim_many(batch)]
    assert states == ["claimed", "claimed", "exhausted"], "the third would pass the cap: skipped, whole"
    assert await claims.budget_used(project, 3600) == 6, "no partial panel: its 3 calls never reserved"
    assert await claims.cost_used(project, 3600) == 2 * per_pair
    (later,) = await claims.claim_many([live_pair(snap, "t-later").claim])
    assert later.state == "exhausted", "a later batch finds the window as full"
    assert await claims.stored(batch[2]) == "skipped:budget"


async def test_a_groups_daily_cap_skips_its_own_pairs_not_its_projects(redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    probe = live_pair(catalog(project, per_day=1.0), "t-probe").claim
    per_pair = probe.cost(probe.judge_calls, probe.judge_tokens)
    claims, snap = Claims(redis), catalog(project, per_day=(per_pair + 1) / 1e9, second_group=True)
    capped = [live_pair(snap, f"t-{i}").claim for i in range(2)]
    free = [live_pair(snap, f"t-{i}", group="h").claim for i in range(2)]
    states = [s.state for s in await claims.claim_many([capped[0], free[0], capped[1], free[1]])]
    assert states == ["claimed", "claimed", "exhausted", "claimed"], "one rubric cannot eat its project's budget"
    assert await claims.group_cost_used(project, "g") == per_pair
    assert await claims.group_cost_used(project, "h") == 0, "no cap: not counted"


async def test_deferred_judges_and_retries_reserve_money_and_settle(
        panel: Panel, judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    snap = catalog(project, cost=5.0, per_day=5.0, judges=2, gates_first=True)
    claims, pair = Claims(redis), live_pair(snap, "t-deferred")
    (state,) = await claims.claim_many([pair.claim])
    assert state.state == "claimed" and state.cost == 0, "deferred: nothing up front"
    judge_server.script(Behaviour.status(503))  # one of the two judges is retried once
    spend = claims.spend(pair.claim)
    result = await panel.score(pair.group, pair.subject, snap, spend=spend)
    requests = judge_server.requests
    assert len(requests) == 3 and result.rating is not None
    reserved = sum(ceiling_nanos(r) for r in requests)
    assert await claims.cost_used(project, 3600) == spend.cost_reserved == reserved, "two judges, one retry"
    assert await claims.group_cost_used(project, "g") == reserved
    cost = cost_of(result)
    assert cost is not None and 0 < cost < reserved
    await claims.mark_done([(pair.claim, "r")], settled=spend.settlements(0, cost))
    assert await claims.cost_used(project, 3600) == cost == await claims.group_cost_used(project, "g")


async def test_a_gates_first_panel_without_money_left_is_skipped_whole(
        panel: Panel, judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    snap = catalog(project, cost=1e-9, judges=2, gates_first=True)  # one nano: no call fits
    claims, pair = Claims(redis), live_pair(snap, "t-poor")
    await claims.claim_many([pair.claim])
    with pytest.raises(Exception, match="no room in the judge budget"):
        await panel.score(pair.group, pair.subject, snap, spend=claims.spend(pair.claim))
    assert judge_server.requests == [] and await claims.cost_used(project, 3600) == 0
    assert await claims.stored(pair.claim) == "skipped:budget"


async def test_an_unpriced_model_under_a_money_cap_is_refused_never_free(redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    claims = Claims(redis)
    capped = live_pair(catalog(project, cost=1_000.0, model="no-price-listed"), "t-unpriced")
    assert (await claims.claim_many([capped.claim]))[0].state == "exhausted", "a cap cannot bound what it cannot price"
    assert await claims.cost_used(project, 3600) == 0
    uncapped = live_pair(catalog(f"{project}-free", model="no-price-listed"), "t-unpriced")
    assert (await claims.claim_many([uncapped.claim]))[0].state == "claimed", "without a money cap: scored"


def test_a_project_key_may_only_lower_the_money_cap() -> None:
    stored = Budget(project_id="p", judge_calls_per_window=100, judge_cost_per_window=25.0)
    tenant = Caller(project_id="p", actor="key:p")
    with pytest.raises(Forbidden, match="judgeCostPerWindow: 30 is above the operators' cap of 25"):
        budget_write(tenant, Budget(project_id="p", judge_calls_per_window=100, judge_cost_per_window=30.0), stored)
    lowered = budget_write(tenant, Budget(project_id="p", judge_calls_per_window=100, judge_cost_per_window=10.0),
                           stored)
    assert (lowered.judge_cost_per_window, lowered.project_judge_cost_per_window, lowered.cost_cap) == (25.0, 10.0, 10.0)
    with pytest.raises(Forbidden, match="projectJudgeCostPerWindow"):
        budget_write(tenant, Budget(project_id="p", judge_calls_per_window=100, project_judge_cost_per_window=1.0),
                     stored)
    raised = budget_write(Caller(), Budget(project_id="p", judge_calls_per_window=100, judge_cost_per_window=50.0),
                          lowered)
    assert raised.cost_cap == 10.0, "the operators' next change keeps the project's own, lower cap"


async def test_a_pair_scored_across_a_windows_end_settles_in_the_window_it_reserved_in(
        panel: Panel, judge_server: JudgeServer, redis: Redis, unique: str) -> None:
    project = f"p-{unique}"
    claims, snap = Claims(redis), catalog(project, cost=5.0, per_day=5.0, judges=1)
    pair = live_pair(snap, "t-boundary")
    end = (int(NOW) // 86_400 + 1) * 86_400  # a window's end, and a day's (hour windows)
    (state,) = await claims.claim_many([pair.claim], end - 1)
    assert state.state == "claimed" and state.cost > 0
    judge_server.script(Behaviour.rating(8))
    spend = claims.spend(pair.claim, claimed_at=end - 1)
    result = await panel.score(pair.group, pair.subject, snap, spend=spend)
    cost = cost_of(result)
    assert cost is not None and 0 < cost < state.cost
    await claims.mark_done([(pair.claim, "r")], settled=spend.settlements(0, cost), now=end + 1)  # done after it
    assert await claims.cost_used(project, 3600, end - 1) == cost, "settled where it was reserved"
    assert await claims.group_cost_used(project, "g", end - 1) == cost
    assert await claims.cost_used(project, 3600, end + 1) == 0, "the next window starts clean, not in credit"
    assert await claims.group_cost_used(project, "g", end + 1) == 0
