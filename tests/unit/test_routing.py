"""Routing a trace to its (group, trace) pairs and the claims that reserve them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from scoring.catalog import CatalogSnapshot
from scoring.judge_prompt import ANSWER_MAX_TOKENS, build_messages
from scoring.models import Budget, Judge, Pattern, ScorerGroup
from scoring.routing import DEFAULT_BUDGET_WINDOW_S, trace_pairs
from scoring.subjects import Trace
from tests.support.sampling_reference import reference_keep


def group(group_id: str, project: str, members: list[dict[str, Any]], *, sample_rate: float = 1.0,
          scope: str = "trace", enabled: bool = True) -> ScorerGroup:
    return ScorerGroup.model_validate({
        "id": group_id, "name": group_id, "projectId": project,
        "online": {"enabled": enabled, "sampleRate": sample_rate, "alertThreshold": None, "severity": "low",
                   "scope": scope},
        "members": [m | {"weight": 1, "gate": False} for m in members]})


JUDGES = [{"kind": "judge", "refId": "j1"}, {"kind": "judge", "refId": "j2"}]
PATTERN = [{"kind": "pattern", "refId": "p"}]


def snapshot(*groups: ScorerGroup, budgets: tuple[Budget, ...] = ()) -> CatalogSnapshot:
    judges = {j: Judge(id=j, name=j, criteria="Is it right?") for j in ("j1", "j2")}
    judges["jx"] = Judge(id="jx", name="JX", criteria="Is it the expected answer?", requires_expected=True)
    return CatalogSnapshot(version=1, groups={f"{g.project_id}/{g.id}": g for g in groups}, judges=judges,
                           patterns={"p": Pattern(id="p", name="P", polarity="failure", contains=["refund"])},
                           budgets={b.project_id: b for b in budgets})


def trace(trace_id: str = "t-1", project: str = "acme", timestamp: str = "2026-12-02T13:00:00Z",
          **extra: str) -> Trace:
    return Trace.model_validate({"traceId": trace_id, "projectId": project, "agentId": "a", "timestamp": timestamp,
                                 "spans": [{"spanId": "r", "input": "q", "output": "fine"}], **extra})


def test_each_live_trace_group_of_the_project_gets_a_pair_with_its_claim() -> None:
    catalog = snapshot(group("judged", "acme", JUDGES), group("patterned", "acme", PATTERN),
                       group("sessions", "acme", PATTERN, scope="session"),
                       group("off", "acme", PATTERN, enabled=False), group("theirs", "other", PATTERN),
                       budgets=(Budget(project_id="acme", judge_calls_per_window=500, window_seconds=600),
                                Budget(project_id="other", judge_calls_per_window=7, window_seconds=60)))
    pairs = trace_pairs(trace(), catalog)
    claims = {p.group.id: p.claim for p in pairs}
    assert sorted(claims) == ["judged", "patterned"], "trace scope, enabled, this project's only"
    assert claims["judged"].judge_calls == 2 and claims["patterned"].judge_calls == 0
    for group_id, claim in claims.items():
        assert claim.group_id == group_id
        assert claim.project_id == "acme" and claim.subject_key == "trace:t-1"
        assert (claim.calls_cap, claim.budget_window_s) == (500, 600), "acme's budget, not another's"
        assert claim.day == 20_789, "the trace's own day: 2026-12-02 is day 20789 since 1970-01-01 (UTC)"
    assert all(p.subject.trace_id == "t-1" and p.subject.output == "fine" for p in pairs)


def test_a_judge_that_needs_an_expected_answer_reserves_a_call_only_when_the_trace_has_one() -> None:
    catalog = snapshot(group("exact", "acme", [*JUDGES, {"kind": "judge", "refId": "jx"}]))
    assert [p.claim.judge_calls for p in trace_pairs(trace(), catalog)] == [2]
    assert [p.claim.judge_calls for p in trace_pairs(trace(expected="42"), catalog)] == [3]


def test_a_project_without_a_budget_claims_without_a_limit() -> None:
    (pair,) = trace_pairs(trace(), snapshot(group("judged", "acme", JUDGES)))
    assert pair.claim.calls_cap is None and pair.claim.budget_window_s == DEFAULT_BUDGET_WINDOW_S


def test_sampling_keeps_the_same_traces_for_groups_at_one_rate_and_its_own_for_a_salted_group() -> None:
    salted = group("salted", "acme", PATTERN, sample_rate=0.5)
    salted = salted.model_copy(update={"online": salted.online.model_copy(update={"sample_salt": "v2"})})  # type: ignore[union-attr]
    catalog = snapshot(group("half", "acme", PATTERN, sample_rate=0.5), group("old-rubric", "acme", PATTERN,
                       sample_rate=0.5), group("all", "acme", PATTERN), salted)
    kept = {f"t-{i}": sorted(p.group.id for p in trace_pairs(trace(f"t-{i}"), catalog)) for i in range(200)}
    assert kept == {t: sorted(["all"] + (["half", "old-rubric"] if reference_keep(t, 0.5) else [])
                              + (["salted"] if reference_keep(t, 0.5, "v2") else [])) for t in kept}
    assert 60 < sum("half" in groups for groups in kept.values()) < 140
    assert {t for t, g in kept.items() if "salted" in g} != {t for t, g in kept.items() if "half" in g}


def test_a_project_with_no_live_groups_has_no_pairs() -> None:
    assert trace_pairs(trace(project="quiet"), snapshot(group("theirs", "other", PATTERN))) == []


def test_a_token_budget_makes_the_claim_reserve_its_judges_token_ceiling() -> None:
    budget = Budget(project_id="acme", judge_calls_per_window=50, judge_tokens_per_window=90_000)
    catalog = snapshot(group("judged", "acme", [*JUDGES, {"kind": "judge", "refId": "jx"}]),
                       group("patterned", "acme", PATTERN), budgets=(budget,))
    french = Trace.model_validate({**trace().model_dump(by_alias=True),
                                   "spans": [{"spanId": "r", "input": "q", "output": "Très bien, ça marche"}]})
    claims = {p.group.id: p for p in trace_pairs(french, catalog)}
    judged = claims["judged"]
    # The ceiling, from its definition (docs/running.md): per call, the UTF-8 bytes of the messages
    # the judge is sent, 8 per message for the chat format, and the answer's max_tokens. jx needs
    # an expected answer the trace lacks: not called, so not reserved.
    ceiling = sum(sum(len(m["content"].encode()) + 8 for m in build_messages(catalog.judges[j], judged.subject))
                  + ANSWER_MAX_TOKENS for j in ("j1", "j2"))
    assert judged.claim.judge_tokens == ceiling > 2 * ANSWER_MAX_TOKENS
    assert judged.claim.tokens_cap == 90_000 and claims["patterned"].claim.tokens_cap == 90_000
    assert claims["patterned"].claim.judge_tokens == 0, "no judge, no tokens"


def test_without_a_token_budget_no_prompt_is_measured() -> None:
    catalog = snapshot(group("judged", "acme", JUDGES),
                       budgets=(Budget(project_id="acme", judge_calls_per_window=50),))
    (pair,) = trace_pairs(trace(), catalog)
    assert (pair.claim.judge_calls, pair.claim.judge_tokens, pair.claim.tokens_cap) == (2, 0, None)


def test_a_gates_first_group_claims_no_judge_up_front() -> None:
    gated = ScorerGroup.model_validate({
        "id": "first", "name": "first", "projectId": "acme", "gatesFirst": True,
        "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low"},
        "members": [{"kind": "pattern", "refId": "p", "gate": True}, *JUDGES]})
    budget = Budget(project_id="acme", judge_calls_per_window=50, judge_tokens_per_window=90_000)
    (pair,) = trace_pairs(trace(), snapshot(gated, budgets=(budget,)))
    assert (pair.claim.judge_calls, pair.claim.judge_tokens) == (0, 0), "reserved by the panel once its gates pass"
    ungated = gated.model_copy(update={"gates_first": False})
    (pair,) = trace_pairs(trace(), snapshot(ungated, budgets=(budget,)))
    assert pair.claim.judge_calls == 2 and pair.claim.judge_tokens > 0


def test_gates_first_defers_the_judges_only_behind_a_free_must_pass_member() -> None:
    budget = Budget(project_id="acme", judge_calls_per_window=50)

    def gates_first(*members: dict[str, Any]) -> ScorerGroup:
        return ScorerGroup.model_validate({
            "id": "first", "name": "first", "projectId": "acme", "gatesFirst": True,
            "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low"},
            "members": list(members)})

    # No free member is a gate (a pattern that only weighs, a judge that must pass): nothing to wait for.
    for members in ([{"kind": "pattern", "refId": "p", "gate": False}, *JUDGES],
                    [{"kind": "judge", "refId": "j1", "gate": True}, {"kind": "judge", "refId": "j2"}]):
        (pair,) = trace_pairs(trace(), snapshot(gates_first(*members), budgets=(budget,)))
        assert pair.claim.judge_calls == 2, members


def test_a_shadow_scores_the_same_sample_as_its_group_until_its_time_by_the_traces_clock() -> None:
    """A candidate judge's shadow of a group is graded beside it on the same traces,
    until ``shadowUntil`` - read against the trace's own time, so a redelivery decides alike."""
    base = group("half", "acme", PATTERN, sample_rate=0.5)
    assert base.online is not None
    shadow = base.model_copy(update={"id": "half-sh", "online": base.online.model_copy(update={
        "shadow_of": "half", "shadow_until": datetime(2026, 12, 2, 14, 0, tzinfo=UTC)})})
    catalog = snapshot(base, shadow)
    before = [sorted(p.group.id for p in trace_pairs(trace(f"t-{i}"), catalog)) for i in range(100)]
    assert all(groups in ([], ["half", "half-sh"]) for groups in before), "the same sample"
    assert any(before)
    after = [sorted(p.group.id for p in trace_pairs(trace(f"t-{i}", timestamp="2026-12-02T14:00:00Z"), catalog))
             for i in range(100)]
    assert all(groups in ([], ["half"]) for groups in after), "past its time: the group alone"
