"""The panel: every member kind for real (judge server, sandbox processes, external HTTP), then
the blend - failures of any member become reasons, never a failed panel."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from adapters.egress import EgressPolicy
from adapters.members.external import ExternalClient
from adapters.members.http import RetryPolicy
from adapters.members.judge import JudgeClient
from adapters.members.sandbox import SandboxPool
from devtools.judge_server import Behaviour, JudgeServer
from scoring.catalog import CatalogSnapshot
from scoring.models import CustomEvaluator, Judge, ScorerGroup
from scoring.panel import Panel, planned_judge_calls
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.panel_catalog import catalog, group, subject

FAST = RetryPolicy(attempts=2, backoff_base_s=0.01, backoff_cap_s=0.02)


@pytest.fixture(scope="module")
def external_server() -> Iterator[ScriptedServer]:
    with ScriptedServer(default=Reply(body={"score": 0.5})) as s:
        yield s


@pytest.fixture
async def panel(judge_server: JudgeServer) -> AsyncIterator[Panel]:
    judge_server.reset()
    judges = JudgeClient(judge_server.base_url, timeout_s=2, policy=FAST)
    external = ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]), policy=FAST)
    sandbox = SandboxPool(size=2)
    await sandbox.start()
    yield Panel(judges=judges, external=external, sandbox=sandbox, member_deadline_s=10)
    await judges.close()
    await external.close()
    await sandbox.close()


async def test_every_member_kind_blends_to_the_hand_computed_score(
        panel: Panel, external_server: ScriptedServer) -> None:
    output = "x" * 30 + " This is not financial advice. [[rating=8]]"  # 73 characters
    g = group(("judge", "quality", 2, False), ("pattern", "apology", 0, True),
              ("pattern", "disclaimer", 1, False), ("custom", "length", 1, False), ("custom", "remote", 1, False))
    result = await panel.score(g, subject(output), catalog(external_server.url))
    assert (result.group, result.subject) == (g, subject(output)), "the result names what it grades"
    by_name = {m.outcome.name: m.outcome for m in result.blend.members}
    assert by_name["Quality"].native == 8 and by_name["Quality"].goodness == 0.8
    assert by_name["Apology"].native is False and by_name["Apology"].goodness == 1.0
    assert by_name["Disclaimer"].goodness == 1.0
    assert by_name["Length"].goodness == pytest.approx(len(output) / 100)
    assert by_name["Remote"].goodness == 0.5
    expected = 10 * (2 * 0.8 + 1 * 1.0 + 1 * len(output) / 100 + 1 * 0.5) / 5
    assert result.rating == pytest.approx(expected)
    assert result.blend.justification.startswith("Weighted blend:")


async def test_failures_become_reasons_and_renormalize(panel: Panel, judge_server: JudgeServer,
                                                       external_server: ScriptedServer) -> None:
    judge_server.script(Behaviour.rating(11))  # off its scale
    g = group(("judge", "quality", 1, False), ("custom", "boom", 1, False),
              ("judge", "deleted-judge", 1, False), ("custom", "length", 1, False))
    result = await panel.score(g, subject("y" * 50), catalog(external_server.url))
    members = {m.outcome.name: m for m in result.blend.members}
    assert members["Quality"].status == "failed"
    assert members["Quality"].outcome.error == "a judge rating must be within 0-10, got 11.0"
    assert members["Boom"].outcome.error == "ZeroDivisionError: division by zero"
    assert members["deleted-judge"].status == "not_scored"
    assert result.rating == pytest.approx(5.0), "only Length (0.5) counted"


async def test_unscorable_gate_fails_closed(panel: Panel, judge_server: JudgeServer,
                                            external_server: ScriptedServer) -> None:
    judge_server.script(*[Behaviour.status(503)] * 2)
    g = group(("judge", "safety", 1, True), ("custom", "length", 1, False))
    result = await panel.score(g, subject("z" * 90), catalog(external_server.url))
    assert result.rating is None
    assert result.blend.reason is not None
    assert result.blend.reason.startswith('No score: must-pass member "Safety" could not score (judge answered HTTP 503')


async def test_apology_tripwire_zeroes_the_group(panel: Panel, external_server: ScriptedServer) -> None:
    g = group(("judge", "quality", 1, False), ("pattern", "apology", 0, True))
    result = await panel.score(g, subject("I'm sorry, I was wrong [[rating=9]]"), catalog(external_server.url))
    assert result.rating == 0.0 and result.blend.decided_by == "Apology"


def test_planned_judge_calls_counts_existing_judges_that_will_be_asked(external_server: ScriptedServer) -> None:
    cat = catalog(external_server.url)
    g = group(("judge", "quality", 1, False), ("judge", "safety", 1, True), ("judge", "gone", 1, False),
              ("pattern", "apology", 0, True))
    assert planned_judge_calls(g, cat, subject("x")) == 2


@pytest.mark.parametrize(("returns", "says"), [
    ("1.5", "a custom score must be within 0..1, got 1.5"),
    ("float('nan')", "a custom score must be a finite number, got nan"),
    ("'high'", "score() returned str, expected a number in 0..1"),
])
async def test_a_code_scorer_off_its_scale_could_not_score(panel: Panel, external_server: ScriptedServer,
                                                           returns: str, says: str) -> None:
    cat = catalog(external_server.url)
    bad = CustomEvaluator(id="bad", name="Bad", type="code", code=f"def score(*a):\n    return {returns}\n")
    cat = CatalogSnapshot(version=2, judges=cat.judges, patterns=cat.patterns, customs={**cat.customs, "bad": bad})
    result = await panel.score(group(("custom", "bad", 1, True), ("custom", "length", 1, False)), subject("x"), cat)
    assert result.rating is None, "a gate that could not score fails closed"
    assert result.blend.reason == f'No score: must-pass member "Bad" could not score ({says})'


@pytest.mark.parametrize(("answer", "invert", "rating"), [
    ({"verdict": True}, False, 10.0),
    ({"verdict": True}, True, 0.0),  # an inverted verdict: "true" means the bad thing was found
    ({"passed": False}, True, 10.0),
])
async def test_an_external_verdict_goes_through_the_scorers_invert(
        panel: Panel, answer: dict[str, bool], invert: bool, rating: float) -> None:
    with ScriptedServer(default=Reply(body=answer)) as server:
        cat = catalog(server.url)
        flagged = CustomEvaluator(id="flag", name="Flag", type="external", url=server.url, invert=invert,
                                  timeout_ms=2000)
        cat = CatalogSnapshot(version=2, customs={**cat.customs, "flag": flagged})
        result = await panel.score(group(("custom", "flag", 1, False)), subject("x"), cat)
    (member,) = result.blend.members
    assert member.outcome.native is answer.get("verdict", answer.get("passed"))
    assert result.rating == rating


async def test_scoring_in_bulk_gives_what_scoring_one_by_one_gives(panel: Panel,
                                                                   external_server: ScriptedServer) -> None:
    scorers = catalog(external_server.url)
    g = group(("pattern", "apology", 0, True), ("pattern", "disclaimer", 1, False),
              ("custom", "length", 2, False), ("custom", "boom", 1, False), ("custom", "deleted", 1, False))
    other = group(("custom", "length", 1, True), ("pattern", "apology", 1, False))
    assert not panel.waits(g, scorers) and not panel.waits(other, scorers)
    assert panel.waits(group(("custom", "remote", 1, False)), scorers)
    assert panel.waits(group(("judge", "quality", 1, False)), scorers)
    outputs = ["short", "I'm sorry, " + "y" * 60, "z" * 120 + " not financial advice", ""]
    items = [(grp, subject(text)) for text in outputs for grp in (g, other)]
    bulk = await panel.score_many(items, scorers)
    alone = [await panel.score(grp, subj, scorers) for grp, subj in items]
    assert [r.rating for r in bulk] == [r.rating for r in alone]
    assert [r.blend.reason for r in bulk] == [r.blend.reason for r in alone]
    assert [[(m.outcome.name, m.status, m.outcome.error) for m in r.blend.members] for r in bulk] == \
           [[(m.outcome.name, m.status, m.outcome.error) for m in r.blend.members] for r in alone]


async def test_bulk_outcomes_are_whole_and_each_member_is_observed(external_server: ScriptedServer) -> None:
    seen: list[tuple[str, str, str | None, float]] = []
    sandbox = SandboxPool(size=2)
    await sandbox.start()
    try:
        p = Panel(sandbox=sandbox, member_deadline_s=10, observe=lambda *call: seen.append(call))
        scorers = catalog(external_server.url)
        g = group(("pattern", "disclaimer", 1, False), ("custom", "length", 2, False), ("custom", "boom", 1, False))
        items = [(g, subject(text)) for text in ("short", "z" * 120 + " not financial advice")]
        bulk = await p.score_many(items, scorers)
        in_bulk, seen[:] = list(seen), []
        alone = [await p.score(grp, subj, scorers) for grp, subj in items]
    finally:
        await sandbox.close()

    def whole(r: Any) -> list[tuple[Any, ...]]:
        return [(m.outcome.name, m.outcome.kind, m.outcome.ref_id, m.outcome.native, m.outcome.goodness,
                 m.outcome.detail, m.outcome.error, m.status) for m in r.blend.members]

    assert [whole(r) for r in bulk] == [whole(r) for r in alone]
    assert [(r.group, r.subject) for r in bulk] == items
    assert whole(bulk[0])[1] == ("Length", "custom", "length", 0.05, 0.05, None, None, "scored")
    assert whole(bulk[0])[2][6] == "ZeroDivisionError: division by zero"
    assert sorted(c[:3] for c in in_bulk) == sorted(c[:3] for c in seen), "observed alike, member by member"
    assert sorted(c[:3] for c in in_bulk) == sorted(
        [("custom", "failed", "ZeroDivisionError: division by zero")] * 2 + [("custom", "scored", None)] * 2
        + [("pattern", "scored", None)] * 2)
    assert all(0 <= c[3] < 60 for c in in_bulk), "seconds it took"


def test_planned_judge_calls_skips_a_judge_that_needs_an_expected_answer_it_lacks(
        external_server: ScriptedServer) -> None:
    cat = catalog(external_server.url)
    exact = Judge(id="exact", name="Exact", criteria="Matches?", requires_expected=True)
    cat = CatalogSnapshot(version=2, judges={**cat.judges, "exact": exact}, patterns=cat.patterns)
    g = group(("pattern", "apology", 0, True), ("judge", "exact", 1, False), ("judge", "quality", 1, False))
    assert planned_judge_calls(g, cat, subject("x")) == 1, "Exact is not asked without an expected answer"
    assert planned_judge_calls(g, cat, subject("x", expected="4")) == 2


async def test_gates_first_calls_the_judges_when_a_free_gate_passes_at_exactly_the_mark(
        panel: Panel, judge_server: JudgeServer, external_server: ScriptedServer) -> None:
    gated = group(("custom", "remote", 0, True), ("judge", "quality", 1, False)).model_copy(update={"gates_first": True})
    external_server.script(Reply(body={"score": 0.5}))  # a must-pass at 0.5 passes (GATE_PASS_MARK)
    result = await panel.score(gated, subject("fine [[rating=6]]"), catalog(external_server.url))
    assert len(judge_server.requests) == 1 and result.rating == 6.0
    external_server.script(Reply(body={"score": 0.49}))
    result = await panel.score(gated, subject("fine [[rating=6]]"), catalog(external_server.url))
    assert len(judge_server.requests) == 1 and result.rating == 0.0, "just under the mark: the judge is skipped"
    assert [m.status for m in result.blend.members] == ["scored", "skipped"]


async def test_a_member_is_named_by_its_label_and_keeps_its_scorers_own_name(
        panel: Panel, external_server: ScriptedServer) -> None:
    labelled = ScorerGroup.model_validate({
        "id": "g", "name": "G", "projectId": "p",
        "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "label": "No apologies"}]})
    result = await panel.score(labelled, subject("fine"), catalog(external_server.url))
    outcome = result.blend.members[0].outcome
    assert (outcome.name, outcome.scorer_name) == ("No apologies", "Apology")
