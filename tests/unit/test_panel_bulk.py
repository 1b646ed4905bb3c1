"""Scoring in bulk (``Panel.score_many``): each code scorer version runs once per project on all
its subjects, in one sandbox message, and every outcome is the one scoring one by one gives -
a verdict off its scale, a boolean through ``invert``, a deadline that passed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.members.sandbox import SandboxPool
from scoring.catalog import CatalogSnapshot
from scoring.models import CustomEvaluator, Pattern, ScorerGroup
from scoring.panel import _PLANS_KEPT, GroupResult, Panel
from scoring.subjects import Subject, Trace, trace_subject
from tests.support.panel_catalog import catalog, group, subject

Observed = list[tuple[str, str, str | None, float]]


@pytest.fixture
async def sandbox() -> AsyncIterator[SandboxPool]:
    pool = SandboxPool(size=2)
    await pool.start()
    yield pool
    await pool.close()


def code(scorer_id: str, name: str, source: str, **over: Any) -> CustomEvaluator:
    return CustomEvaluator(id=scorer_id, name=name, type="code", code=source, **over)


def scorers_with(*customs: CustomEvaluator, patterns: tuple[Pattern, ...] = ()) -> CatalogSnapshot:
    base = catalog("http://127.0.0.1:9")
    return CatalogSnapshot(version=2, judges=base.judges, patterns={**base.patterns, **{p.id: p for p in patterns}},
                           customs={**base.customs, **{c.id: c for c in customs}})


def of(project: str, output: str) -> Subject:
    return subject(output, project_id=project, metadata={"project": project})


def whole(result: GroupResult) -> list[tuple[Any, ...]]:
    return [(m.outcome.name, m.outcome.kind, m.outcome.ref_id, m.outcome.native, m.outcome.goodness,
             m.outcome.detail, m.outcome.error, m.status) for m in result.blend.members]


async def both_ways(panel: Panel, items: list[tuple[ScorerGroup, Subject]], scorers: CatalogSnapshot,
                    seen: Observed) -> tuple[list[GroupResult], list[GroupResult], Observed, Observed]:
    """The results in bulk and one by one, with what the observer saw each way."""
    seen.clear()
    bulk = await panel.score_many(items, scorers)
    in_bulk = list(seen)
    seen.clear()
    alone = [await panel.score(g, s, scorers) for g, s in items]
    return bulk, alone, in_bulk, list(seen)


async def test_each_code_scorer_version_is_one_sandbox_message_per_project(sandbox: SandboxPool) -> None:
    words = code("words", "Words", "def score(input, output, expected, spans, metadata):\n"
                                   "    return min(1.0, len(output.split()) / 10)\n")
    g = group(("custom", "length", 1, False), ("custom", "words", 1, False), ("pattern", "disclaimer", 1, False))
    items = [(g, of("p1", "one two three")), (g, of("p1", "a " * 30)), (g, of("p1", "")),
             (g, of("p2", "four five")), (g, of("p2", "not financial advice"))]
    panel = Panel(sandbox=sandbox, member_deadline_s=10)
    before = sandbox.messages
    bulk = await panel.score_many(items, scorers_with(words))
    assert sandbox.messages - before == 4, "2 code scorer versions x 2 projects"
    alone = [await panel.score(g, s, scorers_with(words)) for g, s in items]
    assert [whole(r) for r in bulk] == [whole(r) for r in alone]


async def test_in_bulk_every_member_is_scored_as_its_own_scorer(sandbox: SandboxPool) -> None:
    # Two code scorers with the same code are still two scorers (each its own name and invert),
    # and a refId names a scorer of the member's own kind: a pattern that shares its id with a
    # code scorer, a judge or an external scorer is not the member's scorer.
    source = "def score(input, output, *a):\n    return 'refund' in output\n"
    asks = code("asks", "Asks for a refund", source)
    calm = code("calm", "No refund talk", source, invert=True)
    shadows = [Pattern(id=ref, name=f"Pattern {ref}", polarity="proper", contains=["refund"])
               for ref in ("asks", "quality", "remote")]
    scorers = scorers_with(asks, calm, patterns=tuple(shadows))
    g = group(("custom", "asks", 1, False), ("custom", "calm", 1, False), ("judge", "quality", 1, False),
              ("custom", "remote", 1, False), ("pattern", "asks", 1, False))
    items = [(g, of("p1", "I want a refund")), (g, of("p1", "thanks"))]
    panel = Panel(sandbox=sandbox, member_deadline_s=10)  # no judge endpoint, no external client
    bulk = await panel.score_many(items, scorers)
    alone = [await panel.score(g, s, scorers) for g, s in items]
    assert [whole(r) for r in bulk] == [whole(r) for r in alone]
    assert [(name, native, goodness, error) for name, _, _, native, goodness, _, error, _ in whole(bulk[0])] == [
        ("Asks for a refund", True, 1.0, None), ("No refund talk", True, 0.0, None),
        ("Quality", None, None, "no judge endpoint is configured"),
        ("Remote", None, None, "external scorers are not enabled in this process"), ("Pattern asks", True, 1.0, None)]


@pytest.mark.parametrize("way", ["one by one", "in bulk"])
async def test_a_code_scorer_never_sees_two_projects(sandbox: SandboxPool, way: str) -> None:
    # The scorer remembers every project whose subjects it was given: it answers 1.0 while it has
    # seen only one, 0.0 once it has seen another tenant's subject.
    nosy = code("nosy", "Nosy", "projects = set()\n"
                                "def score(input, output, expected, spans, metadata):\n"
                                "    projects.add(metadata['project'])\n"
                                "    return 1.0 if len(projects) == 1 else 0.0\n")
    g = group(("custom", "nosy", 1, False))
    items = [(g, of("p1", "x")), (g, of("p2", "y")), (g, of("p1", "z"))]
    panel = Panel(sandbox=sandbox, member_deadline_s=10)
    if way == "in bulk":
        results = await panel.score_many(items, scorers_with(nosy))
    else:
        results = [await panel.score(g, s, scorers_with(nosy)) for g, s in items]
    assert [r.rating for r in results] == [10.0, 10.0, 10.0]


async def test_off_scale_and_inverted_code_verdicts_are_the_same_in_bulk(sandbox: SandboxPool) -> None:
    seen: Observed = []
    panel = Panel(sandbox=sandbox, member_deadline_s=10, observe=lambda *call: seen.append(call))
    bad = code("bad", "Bad", "def score(input, output, *a):\n    return len(output) / 2\n")
    # A boolean verdict through invert: true means the bad thing was found.
    leak = code("leak", "Leak", "def score(input, output, *a):\n    return 'secret' in output\n", invert=True)
    g = group(("custom", "bad", 1, False), ("custom", "leak", 1, True))
    items = [(g, of("p1", "abc")), (g, of("p1", "the secret is out")), (g, of("p1", "okay"))]
    bulk, alone, in_bulk, one_by_one = await both_ways(panel, items, scorers_with(bad, leak), seen)
    assert [whole(r) for r in bulk] == [whole(r) for r in alone]
    assert whole(bulk[0]) == [
        ("Bad", "custom", "bad", 1.5, None, None, "a custom score must be within 0..1, got 1.5", "failed"),
        ("Leak", "custom", "leak", False, 1.0, None, None, "scored")]
    assert whole(bulk[1])[1] == ("Leak", "custom", "leak", True, 0.0, None, None, "scored")
    assert [r.rating for r in bulk] == [10.0, 0.0, 10.0], "a found leak fails the gate; Bad never counts"
    assert sorted(c[:3] for c in in_bulk) == sorted(c[:3] for c in one_by_one), "observed alike, member by member"
    assert all(isinstance(c[3], float) and c[3] >= 0 for c in in_bulk), "seconds it took"


async def test_in_bulk_a_code_scorer_past_the_panels_deadline_could_not_score(sandbox: SandboxPool) -> None:
    seen: Observed = []
    panel = Panel(sandbox=sandbox, member_deadline_s=0.5, observe=lambda *call: seen.append(call))
    slow = code("slow", "Slow", "import time\ndef score(*a):\n    time.sleep(5)\n    return 1.0\n", timeout_ms=2000)
    g = group(("custom", "slow", 1, False), ("pattern", "disclaimer", 1, False))
    results = await panel.score_many([(g, of("p1", "not financial advice")), (g, of("p1", "no"))], scorers_with(slow))
    assert [whole(r)[0] for r in results] == [
        ("Slow", "custom", "slow", None, None, None, "timed out after 0.5s", "failed")] * 2
    assert [r.rating for r in results] == [10.0, 0.0], "the disclaimer alone counted"
    assert sorted(c[:3] for c in seen) == [("custom", "failed", "timed out after 0.5s")] * 2 + [
        ("pattern", "scored", None)] * 2


async def test_a_pattern_that_did_not_match_shares_one_outcome_and_a_new_version_gets_its_own() -> None:
    seen: Observed = []
    panel = Panel(observe=lambda *event: seen.append(event))
    scorers = scorers_with()
    members = group(("pattern", "apology", 1, False), ("pattern", "disclaimer", 1, False))
    results = await panel.score_many([(members, of("p", text)) for text in
                                      ("Fine.", "Also fine.", "I'm sorry about that.", "Fine again.")], scorers)
    apology = [r.blend.members[0].outcome for r in results]
    assert apology[0] is apology[1] is apology[3], "one outcome for every subject it did not match"
    assert (apology[0].native, apology[0].goodness, apology[0].detail) == (
        False, 1.0, "template apology did not match the output")
    assert (apology[2].native, apology[2].goodness, apology[2].detail) == (
        True, 0.0, "template apology matched in output at offset 0")
    assert [r.rating for r in results] == [5.0, 5.0, 0.0, 5.0]
    assert len(seen) == 8, "every member of every subject is observed, shared outcome or not"

    renamed = Pattern(id="apology", name="Sorry", polarity="proper", template="apology")
    again = await panel.score_many([(members, of("p", "Fine."))], scorers_with(patterns=(renamed,)))
    outcome = again[0].blend.members[0].outcome
    assert (outcome.name, outcome.goodness) == ("Sorry", 0.0), "a new version of the pattern: its own outcome"


async def test_the_shared_no_match_outcomes_are_bounded_however_many_members_a_catalog_has() -> None:
    # A tenant may save many groups: the outcomes kept for reuse stay bounded, and an outcome is
    # never reused for a member it was not built for (a kept id is checked by identity).
    panel = Panel()
    scorers = scorers_with()
    groups = [group(("pattern", "apology", 1, False)) for _ in range(_PLANS_KEPT + 10)]
    for members in groups:
        await panel.score_many([(members, of("p", "Fine."))], scorers)
    assert len(panel._plans) <= _PLANS_KEPT
    outcomes = [(await panel.score_many([(g, of("p", "Fine."))], scorers))[0].blend.members[0].outcome
                for g in groups[:2]]
    assert outcomes[0] is not outcomes[1] and outcomes[0] == outcomes[1], "each member its own, equal outcome"


async def test_in_bulk_each_code_call_reads_its_own_traces_spans_only(sandbox: SandboxPool) -> None:
    # Spans are made JSON-shaped per subject, only when a code scorer asks: one batch holds two
    # tenants' traces, and each call must read exactly its own trace's spans - never a neighbour's,
    # however the tenant shaped them (a span id naming the other project, a forged "spans" key).
    def traced(project: str, n: int) -> Subject:
        return trace_subject(Trace.model_validate({
            "traceId": f"{project}-t{n}", "projectId": project, "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
            "metadata": {"project": project},
            "spans": [{"spanId": f"{project}-root", "input": "q", "output": f"answer {n}",
                       "attributes": {"spans": [{"spanId": "p-other-root"}], "owner": project}},
                      {"spanId": f"{project}-llm", "parentSpanId": f"{project}-root", "kind": "llm",
                       "output": "p-other"}]}))

    mine = code("mine", "Mine", "def score(input, output, expected, spans, metadata):\n"
                                "    p = metadata['project']\n"
                                "    return float([s['spanId'] for s in spans] == [p + '-root', p + '-llm']\n"
                                "                 and spans[0]['attributes']['owner'] == p)\n")
    g = group(("custom", "mine", 1, False))
    items = [(g, traced(project, n)) for n in range(3) for project in ("p-one", "p-other")]
    results = await Panel(sandbox=sandbox, member_deadline_s=10).score_many(items, scorers_with(mine))
    assert [r.blend.members[0].outcome.native for r in results] == [1.0] * 6
