"""The panel's deadlines and reasons: a member that could not score says why on the result
(what the blend renormalizes around, or fails a gate closed with), the other members still
count, and text from models and tenants' services is cut of secrets before it is shown."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from structlog.testing import capture_logs

import scoring.members.patterns
import scoring.panel
from adapters.egress import EgressPolicy
from adapters.members.external import ExternalClient
from adapters.members.http import RetryPolicy
from adapters.members.judge import JudgeClient
from adapters.members.sandbox import SandboxPool
from devtools.judge_server import Behaviour, JudgeServer
from scoring.catalog import CatalogSnapshot
from scoring.models import CustomEvaluator, Pattern
from scoring.panel import Panel
from scoring.redact import Redactor
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.panel_catalog import catalog, group, subject

FAST = RetryPolicy(attempts=2, backoff_base_s=0.01, backoff_cap_s=0.02)
Observed = list[tuple[str, str, str | None, float]]


@pytest.fixture
async def sandbox() -> AsyncIterator[SandboxPool]:
    pool = SandboxPool(size=2)
    await pool.start()
    yield pool
    await pool.close()


@pytest.fixture
async def judges(judge_server: JudgeServer) -> AsyncIterator[JudgeClient]:
    judge_server.reset()
    client = JudgeClient(judge_server.base_url, timeout_s=10, policy=FAST)
    yield client
    await client.close()


@pytest.fixture
async def external() -> AsyncIterator[ExternalClient]:
    client = ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]), policy=FAST)
    yield client
    await client.close()


def with_customs(scorers: CatalogSnapshot, *customs: CustomEvaluator) -> CatalogSnapshot:
    return CatalogSnapshot(version=2, judges=scorers.judges, patterns=scorers.patterns,
                           customs={**scorers.customs, **{c.id: c for c in customs}})


SLOW_CODE = "import time\ndef score(*a):\n    time.sleep(5)\n    return 1.0\n"


async def test_a_member_past_the_panels_deadline_could_not_score_and_the_others_still_count(
        judge_server: JudgeServer, judges: JudgeClient, sandbox: SandboxPool) -> None:
    judge_server.script(Behaviour.hang(5))
    seen: Observed = []
    panel = Panel(judges=judges, sandbox=sandbox, member_deadline_s=0.5, observe=lambda *call: seen.append(call))
    scorers = with_customs(catalog("http://127.0.0.1:9"),
                           CustomEvaluator(id="slow", name="Slow", type="code", code=SLOW_CODE, timeout_ms=10_000))
    g = group(("judge", "quality", 1, False), ("custom", "slow", 1, False), ("pattern", "disclaimer", 1, False))
    result = await panel.score(g, subject("not financial advice"), scorers)
    members = {m.outcome.name: m for m in result.blend.members}
    assert members["Quality"].status == "failed" and members["Quality"].outcome.error == "timed out after 0.5s"
    assert members["Slow"].status == "failed" and members["Slow"].outcome.error == "timed out after 0.5s"
    assert result.rating == 10.0, "the disclaimer alone counted"
    assert sorted(call[:3] for call in seen) == [("custom", "failed", "timed out after 0.5s"),
                                                 ("judge", "failed", "timed out after 0.5s"),
                                                 ("pattern", "scored", None)]


@pytest.mark.parametrize("way", ["one by one", "in bulk"])
async def test_a_code_scorer_is_cut_at_its_own_timeout(sandbox: SandboxPool, way: str) -> None:
    panel = Panel(sandbox=sandbox, member_deadline_s=30)
    scorers = with_customs(catalog("http://127.0.0.1:9"),
                           CustomEvaluator(id="slow", name="Slow", type="code", code=SLOW_CODE, timeout_ms=1000))
    g = group(("custom", "slow", 1, True))
    if way == "in bulk":
        (result,) = await panel.score_many([(g, subject("x"))], scorers)
    else:
        result = await panel.score(g, subject("x"), scorers)
    assert result.blend.reason == 'No score: must-pass member "Slow" could not score (timed out after 1000 ms)'


async def test_an_external_answer_within_its_timeout_counts(external: ExternalClient) -> None:
    with ScriptedServer(default=Reply(body={"score": 0.9})) as server:
        quick = CustomEvaluator(id="quick", name="Quick", type="external", url=server.url, timeout_ms=500)
        result = await Panel(external=external).score(group(("custom", "quick", 1, False)), subject("x"),
                                                      with_customs(catalog(server.url), quick))
    assert result.rating == pytest.approx(9.0)


async def test_an_external_answer_trickling_in_past_its_timeout_does_not_count(external: ExternalClient) -> None:
    # Headers at once, then the body a byte at a time for 6 s: each read is quick, so only a
    # deadline on the whole call - the scorer's timeout plus the panel's slack - ends it.
    slow_body = b" " * 60 + b'{"score": 0.9}'
    with ScriptedServer(default=Reply(body=slow_body, trickle_s=6)) as server:
        loris = CustomEvaluator(id="loris", name="Loris", type="external", url=server.url, timeout_ms=500)
        panel = Panel(external=external, member_deadline_s=60)
        result = await panel.score(group(("custom", "loris", 1, False), ("pattern", "disclaimer", 1, False)),
                                   subject("not financial advice"), with_customs(catalog(server.url), loris))
    members = {m.outcome.name: m for m in result.blend.members}
    assert members["Loris"].status == "failed" and members["Loris"].outcome.goodness is None
    assert "timed out" in (members["Loris"].outcome.error or "")
    assert result.rating == 10.0, "the disclaimer alone counted"


async def test_an_external_scorer_cut_at_its_own_timeout_names_that_timeout(external: ExternalClient) -> None:
    # A slow scorer (its body trickles in over 6 s, each read quick) with a 300 ms timeout of its
    # own: that timeout fires, long before the panel's 60 s member deadline, and is the one named.
    slow_body = b" " * 60 + b'{"score": 0.9}'
    with ScriptedServer(default=Reply(body=slow_body, trickle_s=6)) as server:
        slow = CustomEvaluator(id="slow", name="Slow", type="external", url=server.url, timeout_ms=300)
        seen: Observed = []
        panel = Panel(external=external, member_deadline_s=60, observe=lambda *call: seen.append(call))
        result = await panel.score(group(("custom", "slow", 1, True)), subject("x"),
                                   with_customs(catalog(server.url), slow))
    assert result.rating is None
    assert result.blend.reason == \
        'No score: must-pass member "Slow" could not score (external scorer timed out after 300 ms)'
    assert [call[:3] for call in seen] == [("custom", "failed", "external scorer timed out after 300 ms")]


@pytest.mark.parametrize("way", ["one by one", "in bulk"])
async def test_a_process_without_a_client_for_a_member_kind_says_so(way: str) -> None:
    panel = Panel()  # no judge endpoint, no sandbox, no external client
    scorers = catalog("http://127.0.0.1:9")
    g = group(("judge", "quality", 1, False), ("custom", "length", 1, False), ("custom", "remote", 1, False),
              ("pattern", "disclaimer", 1, False))
    if way == "in bulk":
        (result,) = await panel.score_many([(g, subject("not financial advice"))], scorers)
    else:
        result = await panel.score(g, subject("not financial advice"), scorers)
    assert {m.outcome.name: (m.status, m.outcome.error) for m in result.blend.members} == {
        "Quality": ("failed", "no judge endpoint is configured"),
        "Length": ("failed", "code scorers are not enabled in this process"),
        "Remote": ("failed", "external scorers are not enabled in this process"),
        "Disclaimer": ("scored", None)}
    assert result.rating == 10.0, "the disclaimer alone counted"


class _Unreadable(str):
    def __getitem__(self, key: object) -> str:
        raise TypeError("unreadable")


@pytest.mark.parametrize("way", ["one by one", "in bulk"])
async def test_an_unexpected_error_costs_only_its_member_and_is_logged_with_it(way: str) -> None:
    # An output text that breaks reading it (a bug of ours: subjects are built here) breaks the
    # pattern that reads the output in a way nobody planned for; it must cost that member, not
    # the group. (A str, as typed: a compiled build refuses a None before any member reads it.)
    scorers = catalog("http://127.0.0.1:9")
    asks_for_mail = Pattern(id="mail-in", name="Mail in input", polarity="failure", template="email",
                            target="input")
    scorers = CatalogSnapshot(version=2, patterns={**scorers.patterns, "mail-in": asks_for_mail})
    g = group(("pattern", "disclaimer", 1, False), ("pattern", "mail-in", 1, False))
    broken = subject(_Unreadable("Buy it."))
    with capture_logs() as logs:
        if way == "in bulk":
            (result,) = await Panel().score_many([(g, broken)], scorers)
        else:
            result = await Panel().score(g, broken, scorers)
    members = {m.outcome.name: m for m in result.blend.members}
    assert (members["Disclaimer"].status, members["Disclaimer"].outcome.error) == ("failed", "internal error: TypeError")
    assert result.rating == 10.0, "the input pattern still counted"
    (entry,) = [e for e in logs if e["log_level"] == "error"]
    assert entry["event"] == "member scorer failed unexpectedly"
    assert (entry["kind"], entry["ref_id"], entry["exc_info"]) == ("pattern", "disclaimer", True)


async def test_a_judge_verdict_off_its_scale_is_shown_with_the_reason(judge_server: JudgeServer,
                                                                      judges: JudgeClient) -> None:
    judge_server.script(Behaviour.rating(11))
    result = await Panel(judges=judges).score(group(("judge", "quality", 1, False)), subject("x"),
                                              catalog("http://127.0.0.1:9"))
    (member,) = result.blend.members
    assert (member.status, member.outcome.native) == ("failed", 11), "what the judge said is never hidden"
    assert member.outcome.error == "a judge rating must be within 0-10, got 11.0"


async def test_what_a_judge_says_is_shown_cut_of_secrets_and_a_pattern_says_where_it_matched(
        judge_server: JudgeServer, judges: JudgeClient) -> None:
    judge_server.script(Behaviour.rating(8, "Helpful, but it echoes the key sk-live-abcdefghijklmnop"))
    panel = Panel(judges=judges, redact=Redactor())
    g = group(("judge", "quality", 1, False), ("pattern", "apology", 0, True))
    result = await panel.score(g, subject("I'm sorry, that was wrong"), catalog("http://127.0.0.1:9"))
    details = {m.outcome.name: m.outcome.detail for m in result.blend.members}
    assert details == {"Quality": "Helpful, but it echoes the key [redacted]",
                       "Apology": "template apology matched in output at offset 0"}


async def test_a_pattern_can_read_the_users_input() -> None:
    scorers = catalog("http://127.0.0.1:9")
    asks_for_mail = Pattern(id="mail-in", name="Mail in input", polarity="failure", template="email",
                            target="input")
    scorers = CatalogSnapshot(version=2, patterns={**scorers.patterns, "mail-in": asks_for_mail})
    result = await Panel().score(group(("pattern", "mail-in", 1, False)),
                                 subject("no address here", input="Write to ann@example.com"), scorers)
    (member,) = result.blend.members
    assert (member.outcome.native, member.outcome.detail) == (True, "template email matched in input at offset 9")
    assert result.rating == 0.0


@pytest.mark.parametrize("way", ["one by one", "in bulk"])
async def test_a_pattern_past_its_deadline_could_not_score(monkeypatch: pytest.MonkeyPatch, way: str) -> None:
    # Long texts are matched in a thread under the pattern deadline; a deadline of 0 s lets the
    # test see one pass without waiting for the real one.
    monkeypatch.setattr(scoring.members.patterns, "DEADLINE_S", 0.0)
    monkeypatch.setattr(scoring.panel, "PATTERN_DEADLINE_S", 0.0)
    g = group(("pattern", "apology", 0, True), ("pattern", "disclaimer", 1, False))
    long_text = subject("z" * 100_000)
    if way == "in bulk":
        (result,) = await Panel().score_many([(g, long_text)], catalog("http://127.0.0.1:9"))
    else:
        result = await Panel().score(g, long_text, catalog("http://127.0.0.1:9"))
    assert result.rating is None
    assert result.blend.reason == 'No score: must-pass member "Apology" could not score (pattern timed out after 0s)'
