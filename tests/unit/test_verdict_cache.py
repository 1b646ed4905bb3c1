"""The verdict cache's core: what a key stands for, what an entry may be, and the panel
reading it - a verdict paid for is not asked again, two identical calls at once are one call, a
failed call is never shared and the pair that counted on it reserves its own."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from adapters.members.http import RetryPolicy
from adapters.members.judge import JudgeClient, RequestShape
from devtools.judge_server import Behaviour, JudgeServer
from scoring.models import Judge, JudgeExample
from scoring.panel import Panel
from scoring.ports import BudgetExhausted, TokenUsage
from scoring.verdict_cache import CachedVerdict, CachePolicy, PairVerdicts, verdict_key
from tests.support.panel_catalog import catalog, group, subject

FAST = RetryPolicy(attempts=1, backoff_base_s=0.01, backoff_cap_s=0.02)
MESSAGES = [{"role": "system", "content": "grade"}, {"role": "user", "content": "Response: hi"}]


def test_a_key_changes_with_everything_that_changes_the_call_and_with_nothing_else() -> None:
    base = verdict_key("p", "j", "gpt-4o-mini", MESSAGES)
    assert verdict_key("p", "j", "gpt-4o-mini", [dict(m) for m in MESSAGES]) == base, "the same call, the same key"
    assert len(base) == 24
    others = {verdict_key("q", "j", "gpt-4o-mini", MESSAGES), verdict_key("p", "k", "gpt-4o-mini", MESSAGES),
              verdict_key("p", "j", "gpt-4o", MESSAGES),
              verdict_key("p", "j", "gpt-4o-mini", [MESSAGES[0], {"role": "user", "content": "Response: hi!"}])}
    assert base not in others and len(others) == 4, "project, judge, model and messages each make another key"


def test_the_panel_keys_a_judge_by_its_criteria_and_examples_and_leaves_out_a_judge_with_its_cache_off() -> None:
    panel = Panel(judges=JudgeClient("http://127.0.0.1:9/v1"), verdict_cache=CachePolicy())
    snapshot = catalog("http://127.0.0.1:9")
    g = group(("judge", "quality", 1, False))
    judge = snapshot.judges["quality"]
    (key,) = panel.verdict_keys(g, snapshot, subject("an answer"))
    assert key.judge_id == "quality" and key.tokens > 0

    def key_with(changed: Judge) -> str:
        changed_snapshot = snapshot.with_docs([changed])
        return panel.verdict_keys(g, changed_snapshot, subject("an answer"))[0].key

    assert key_with(judge.model_copy(update={"criteria": judge.criteria + " Be strict."})) != key.key
    example = JudgeExample(id="e1", input="q", output="a", rating=3)
    assert key_with(judge.model_copy(update={"examples": [example]})) != key.key
    assert key_with(judge.model_copy(update={"name": "Renamed"})) == key.key, "a name is not part of the call"
    assert key_with(judge.model_copy(update={"model": "gpt-4o"})) != key.key, "the judge's own model is"
    assert panel.verdict_keys(g, snapshot, subject("another answer"))[0].key != key.key
    off = snapshot.with_docs([judge.model_copy(update={"cache": False})])
    assert panel.verdict_keys(g, off, subject("an answer")) == [], '"cache": false is never looked up'
    other_shape = Panel(judges=JudgeClient("http://127.0.0.1:9/v1", shape=RequestShape(response_format=False)),
                        verdict_cache=CachePolicy())
    other_endpoint = Panel(judges=JudgeClient("http://127.0.0.1:8/v1"), verdict_cache=CachePolicy())
    assert other_shape.verdict_keys(g, snapshot, subject("an answer"))[0].key != key.key
    assert other_endpoint.verdict_keys(g, snapshot, subject("an answer"))[0].key != key.key, \
        "the endpoint and the request's shape are part of the call"
    twice = group(("judge", "quality", 1, False), ("judge", "quality", 2, False))
    assert [k.key for k in panel.verdict_keys(twice, snapshot, subject("an answer"))] == [key.key] * 2, \
        "a judge two members name: two calls to look up, one key"
    assert Panel(judges=JudgeClient("http://127.0.0.1:9/v1")).verdict_keys(g, snapshot, subject("x")) == [], \
        "no policy (SGW_JUDGE_CACHE_TTL_S=0): no keys"


def test_an_entry_is_read_back_whole_and_anything_else_is_no_entry() -> None:
    verdict = CachedVerdict(7.5, "Fine.", "r-1", TokenUsage(120, 30))
    assert CachedVerdict.decode(verdict.encode()) == verdict
    assert CachedVerdict.decode(CachedVerdict(2.0, "", "r-2").encode()) == CachedVerdict(2.0, "", "r-2")
    for bad in (b"", None, b"not json", b"[]", b'{"r": "7", "j": "", "p": "", "u": null}',
                b'{"r": true, "j": "", "p": "", "u": null}', b'{"r": 1}'):
        assert CachedVerdict.decode(bad) is None, bad


@pytest.fixture
async def panel(judge_server: JudgeServer) -> AsyncIterator[Panel]:
    judge_server.reset()
    judges = JudgeClient(judge_server.base_url, timeout_s=2, policy=FAST)
    yield Panel(judges=judges, member_deadline_s=5, verdict_cache=CachePolicy())
    await judges.close()


def pair_verdicts(panel: Panel, output: str, rating_id: str, *, reserved: bool) -> PairVerdicts:
    verdicts = PairVerdicts()
    verdicts.rating_id = rating_id
    keys = panel.verdict_keys(group(("judge", "quality", 1, False)), catalog("http://127.0.0.1:9"), subject(output))
    verdicts.keys = {k.judge_id: k for k in keys}
    if reserved:
        verdicts.reserved = {k.key for k in keys}
    return verdicts


class Slots:
    """A pair's spend as the panel sees it (retries and a call it did not reserve at claim time
    take from its room)."""

    def __init__(self, room: int) -> None:
        self.room, self.taken = room, 0
        self.counts_tokens = False

    async def reserve_retry(self, tokens: int) -> bool:
        return await self.reserve_panel(1, tokens)

    async def reserve_panel(self, calls: int, tokens: int) -> bool:
        if self.room < self.taken + calls:
            return False
        self.taken += calls
        return True


async def test_a_verdict_paid_for_is_not_asked_again_and_says_who_paid(panel: Panel, judge_server: JudgeServer) -> None:
    g, snapshot = group(("judge", "quality", 1, False)), catalog("http://127.0.0.1:9")
    verdicts = pair_verdicts(panel, "answer [[rating=6]] [[key=k]]", "r-first", reserved=True)
    (key,) = verdicts.keys.values()
    verdicts.hits[key.key] = CachedVerdict(9.0, "Paid before.", "r-paid", TokenUsage(100, 20))
    result = await panel.score(g, subject("answer [[rating=6]] [[key=k]]"), snapshot, verdicts=verdicts)
    (member,) = [m.outcome for m in result.blend.members]
    assert judge_server.calls_by_key["k"] == 0, "no call"
    assert (member.native, member.detail, member.cached_from, member.usage) == (9.0, "Paid before.", "r-paid", None)
    (call,) = member.calls
    assert call.cached_from == "r-paid" and call.attempts == 0 and "answer" in call.messages[-1][1], \
        "its call record links to the call that paid, with what it would have asked"
    assert verdicts.fresh == {}, "nothing new to keep"


async def test_two_identical_calls_at_once_are_one_and_a_failed_one_is_never_shared(
        panel: Panel, judge_server: JudgeServer) -> None:
    g, snapshot = group(("judge", "quality", 1, False)), catalog("http://127.0.0.1:9")
    text = "same [[rating=4]] [[key=same]]"
    judge_server.set_default(Behaviour.deterministic(delay=0.2))
    try:
        leader = pair_verdicts(panel, text, "r-leader", reserved=True)
        follower = pair_verdicts(panel, text, "r-follower", reserved=False)
        follower_slots = Slots(room=0)
        first, second = await asyncio.gather(
            panel.score(g, subject(text), snapshot, verdicts=leader),
            panel.score(g, subject(text), snapshot, verdicts=follower, spend=follower_slots))  # type: ignore[arg-type]
        assert judge_server.calls_by_key["same"] == 1, "the second waited for the first's call"
        assert second.blend.members[0].outcome.cached_from == "r-leader" and second.rating == first.rating == 4.0
        assert follower_slots.taken == 0 and next(iter(leader.fresh.values())).paid_by == "r-leader"

        # The leader's call fails: the follower reserves a call of its own and makes it.
        judge_server.script(Behaviour.content("no verdict here").with_delay(0.2))
        failing = "fails [[key=fails]]"
        leader, follower = (pair_verdicts(panel, failing, "r-1", reserved=True),
                            pair_verdicts(panel, failing, "r-2", reserved=False))
        slots = Slots(room=1)
        first, second = await asyncio.gather(
            panel.score(g, subject(failing), snapshot, verdicts=leader),
            panel.score(g, subject(failing), snapshot, verdicts=follower, spend=slots))  # type: ignore[arg-type]
        assert first.blend.members[0].outcome.error is not None and leader.fresh == {}, "an error is never kept"
        assert second.rating == 7.0 and second.blend.members[0].outcome.cached_from is None
        assert slots.taken == 1 and judge_server.calls_by_key["fails"] == 2

        # ... and with no room for it, the pair is skipped whole for budget, uncalled (never a
        # partial panel).
        judge_server.script(Behaviour.content("no verdict here").with_delay(0.2))
        broke = "broke [[key=broke]]"
        leader, follower = (pair_verdicts(panel, broke, "r-3", reserved=True),
                            pair_verdicts(panel, broke, "r-4", reserved=False))
        _, second = await asyncio.gather(
            panel.score(g, subject(broke), snapshot, verdicts=leader),
            panel.score(g, subject(broke), snapshot, verdicts=follower, spend=Slots(room=0)),  # type: ignore[arg-type]
            return_exceptions=True)
        assert isinstance(second, BudgetExhausted)
        assert judge_server.calls_by_key["broke"] == 1
    finally:
        judge_server.set_default(Behaviour.deterministic())


async def test_a_judge_on_another_model_is_asked_itself_never_served_the_other_models_verdict(
        panel: Panel, judge_server: JudgeServer) -> None:
    """The same judge and messages on two models at once (a judge's model changed between two
    pairs): two calls, one to each model - no verdict of one model stands in for the other's."""
    g, snapshot = group(("judge", "quality", 1, False)), catalog("http://127.0.0.1:9")
    on_4o = snapshot.with_docs([snapshot.judges["quality"].model_copy(update={"model": "gpt-4o"})])
    text = "same [[rating=4]] [[key=models]]"

    def verdicts_in(catalog_now: object, rating_id: str) -> PairVerdicts:
        verdicts = PairVerdicts()
        verdicts.rating_id = rating_id
        found = panel.verdict_keys(g, catalog_now, subject(text))  # type: ignore[arg-type]
        verdicts.keys = {k.judge_id: k for k in found}
        verdicts.reserved = {k.key for k in found}
        return verdicts

    judge_server.set_default(Behaviour.deterministic(delay=0.2))
    try:
        first, second = await asyncio.gather(
            panel.score(g, subject(text), snapshot, verdicts=verdicts_in(snapshot, "r-mini")),
            panel.score(g, subject(text), on_4o, verdicts=verdicts_in(on_4o, "r-4o")))
    finally:
        judge_server.set_default(Behaviour.deterministic())
    assert judge_server.calls_by_key["models"] == 2, "each model asked"
    models = [r["model"] for r in judge_server.requests]
    assert len(models) == 2 and len(set(models)) == 2 and "gpt-4o" in models, models
    assert second.blend.members[0].outcome.cached_from is None and first.blend.members[0].outcome.cached_from is None


async def test_a_verdict_off_its_scale_is_not_kept(panel: Panel, judge_server: JudgeServer) -> None:
    judge_server.script(Behaviour.rating(11))
    verdicts = pair_verdicts(panel, "x [[key=off]]", "r", reserved=True)
    result = await panel.score(group(("judge", "quality", 1, False)), subject("x [[key=off]]"),
                               catalog("http://127.0.0.1:9"), verdicts=verdicts)
    assert result.blend.members[0].outcome.error is not None and verdicts.fresh == {}
    assert not panel.flights.flying(next(iter(verdicts.keys.values())).key)
