"""The session sweep's rules on the real Redis and broker (the spec's "Scoring whole sessions"):
which projects, sessions and groups are due, the stable per-conversation sample, the judge
budget, whole backlogs past one page, what is recorded for a judged session, and what stays in
the index for the next sweep."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import pytest
from redis.asyncio import Redis
from structlog.testing import capture_logs

from adapters.egress import EgressPolicy
from adapters.members.external import ExternalClient
from adapters.members.judge import JudgeClient
from adapters.stores import keys
from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from adapters.stores.sessions import QuietSession, SessionStore
from consumers.events import Silent
from consumers.sessions import PAGE
from devtools.judge_server import JudgeServer
from scoring.models import Budget, CustomEvaluator, Judge, ScorerGroup
from scoring.panel import Panel
from scoring.subjects import Trace
from scoring.verdict_cache import CachePolicy
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.sampling_reference import reference_keep
from tests.support.session_sweeps import Sweep, project_sweep, session_group, turn

pytestmark = pytest.mark.integration


@pytest.fixture
async def sweep(redis: Redis, kafka_bootstrap: str, unique: str) -> AsyncIterator[Sweep]:
    async with project_sweep(redis, kafka_bootstrap, unique) as s:
        yield s


class Recorded(Silent):
    """The events the sweep reports (the worker turns them into metrics)."""

    def __init__(self) -> None:
        self.kept_pairs: list[tuple[str, str]] = []
        self.skipped: list[tuple[str, str, str]] = []

    def kept(self, project: str, group: str, count: int = 1) -> None:
        self.kept_pairs += [(project, group)] * count

    def group_skipped(self, project: str, group: str, why: str, count: int = 1) -> None:
        self.skipped.append((project, group, why))


def broken_turns(project: str, session: str) -> list[Trace]:
    """Two turns that read, but not as one conversation: the second asks with a number past 64
    bits, which the transcript cannot write out."""
    asks_too_big = Trace.model_validate({**turn(project, session, 2).model_dump(by_alias=True),
                                         "spans": [{"spanId": "r", "input": {"n": 2 ** 70}, "output": "fine"}]})
    return [turn(project, session, 1), asks_too_big]


def said(project: str, session: str, n: int, timestamp: str, words: str) -> Trace:
    return Trace.model_validate({"traceId": f"{session}-{n}", "projectId": project, "agentId": "a",
                                 "sessionId": session, "timestamp": timestamp,
                                 "spans": [{"spanId": "r", "input": words, "output": "fine"}]})


async def test_one_turn_sessions_broken_sessions_and_groups_not_yet_due_never_stop_the_rest(sweep: Sweep) -> None:
    # Oldest first on the page: a one-turn session, then one that cannot be assembled, then one
    # due. The 60 s group comes before the 10 s group, and is not due yet.
    catalog = sweep.catalog(session_group(sweep.project, "a-slow", idle=60),
                            session_group(sweep.project, "b-fast", idle=10))
    t0 = time.time()
    await sweep.add_turns("s-one", 1, at=t0 - 2)
    await sweep.store.add_turns(broken_turns(sweep.project, "s-broken"), now=t0 - 1)
    await sweep.add_turns("s-fine", 2, at=t0)
    with capture_logs() as logs:
        assert await sweep.sweeper(catalog).sweep_once(now=t0 + 15) == 1
    assert await sweep.ratings(1) == [("b-fast", "s-fine", 2)]
    (dropped,) = [e for e in logs if e["event"] == "session cannot be assembled; dropped from the sweep"]
    assert (dropped["project"], dropped["session"], dropped["log_level"]) == (sweep.project, "s-broken", "warning")
    assert "Integer exceeds 64-bit range" in dropped["error"], "the log says why"
    assert await sweep.index() == {"s-one", "s-fine"}, \
        "the broken session leaves the index (until it grows); the others wait for the 60 s group"


async def test_a_session_mixing_turn_times_with_and_without_a_zone_is_judged_once_idle(sweep: Sweep) -> None:
    # A time without a zone is read as UTC: the naive turn at 13:00:02 comes after the one at
    # 14:00:01+02:00 (12:00:01 UTC), and the conversation is judged in that order.
    p, session = sweep.project, "s-mixed"
    with ScriptedServer(default=Reply(body={"score": 1.0})) as server:
        scorer = CustomEvaluator(id="ext", name="Ext", type="external", url=server.url, timeout_ms=5000)
        catalog = sweep.catalog(session_group(p, idle=10, members=[
            {"kind": "custom", "refId": "ext", "weight": 1, "gate": False}]), customs={"ext": scorer})
        external = ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]))
        t0 = time.time()
        await sweep.store.add_turns([said(p, session, 1, "2026-12-02T13:00:02", "asked second"),
                                  said(p, session, 2, "2026-12-02T14:00:01+02:00", "asked first")], now=t0)
        try:
            sweeper = sweep.sweeper(catalog, panel=Panel(external=external))
            assert await sweeper.sweep_once(now=t0 + 5) == 0, "not idle yet"
            with capture_logs() as logs:
                assert await sweeper.sweep_once(now=t0 + 10) == 1
        finally:
            await external.close()
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []
    assert await sweep.ratings(1) == [("conv", session, 2)]
    (request,) = server.requests
    assert request.json()["input"] == "asked first\n\nasked second"
    assert await sweep.index() == set(), "judged: it leaves the index"


async def test_a_filtered_session_group_judges_the_conversation_made_of_its_matching_turns(sweep: Sweep) -> None:
    # Each turn is filtered alone, as a trace is: the group aimed at the chat channel judges the
    # two chat turns together; the unfiltered group the whole conversation; a conversation with
    # one chat turn is not judged by the aimed group (2+ turns, as always).
    p = sweep.project

    def on(channel: str, trace: Trace) -> Trace:
        return trace.model_copy(update={"metadata": {"channel": channel}})

    chat_only = {"field": "metadata.channel", "op": "eq", "value": "chat"}
    with ScriptedServer(default=Reply(body={"score": 1.0})) as server:
        scorer = CustomEvaluator(id="ext", name="Ext", type="external", url=server.url, timeout_ms=5000)
        members = [{"kind": "custom", "refId": "ext", "weight": 1, "gate": False}]
        aimed = ScorerGroup.model_validate({**session_group(p, "aimed", idle=10, members=members).wire(),
                                            "online": {**session_group(p, idle=10).wire()["online"],  # type: ignore[dict-item]
                                                       "filter": chat_only}})
        catalog = sweep.catalog(aimed, session_group(p, "whole", idle=10, members=members), customs={"ext": scorer})
        external = ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]))
        t0 = time.time()
        await sweep.store.add_turns([on("chat", said(p, "s-mixed", 1, "2026-12-02T13:00:01Z", "first chat")),
                                     on("email", said(p, "s-mixed", 2, "2026-12-02T13:00:02Z", "an email")),
                                     on("chat", said(p, "s-mixed", 3, "2026-12-02T13:00:03Z", "second chat")),
                                     on("chat", said(p, "s-one-chat", 1, "2026-12-02T13:00:01Z", "chat")),
                                     on("email", said(p, "s-one-chat", 2, "2026-12-02T13:00:02Z", "email"))],
                                    now=t0)
        try:
            assert await sweep.sweeper(catalog, panel=Panel(external=external)).sweep_once(now=t0 + 10) == 3
        finally:
            await external.close()
    assert await sweep.ratings(3) == [("aimed", "s-mixed", 2), ("whole", "s-mixed", 3), ("whole", "s-one-chat", 2)]
    inputs = sorted(r.json()["input"] for r in server.requests)
    assert inputs == ["chat\n\nemail", "first chat\n\nan email\n\nsecond chat", "first chat\n\nsecond chat"]


async def test_a_backlog_of_more_than_two_pages_is_judged_whole_in_one_sweep(sweep: Sweep) -> None:
    catalog = sweep.catalog(session_group(sweep.project, "a-slow", idle=60),
                            session_group(sweep.project, "b-fast", idle=10))
    sweeper = sweep.sweeper(catalog)
    t0 = time.time()
    backlog = 2 * PAGE + 1
    await sweep.store.add_turns(broken_turns(sweep.project, "s-broken"), now=t0 - 1)  # on the first page
    await sweep.store.add_turns([turn(sweep.project, f"s-{i:03d}", n) for i in range(backlog) for n in (1, 2)], now=t0)

    assert await sweeper.sweep_once(now=t0 + 30) == backlog, "the 10 s group, every session: they stay for the 60 s one"
    assert len(await sweep.index()) == backlog, "only the broken session left the index"
    assert await sweeper.sweep_once(now=t0 + 60) == backlog, "the 60 s group, every session: now they all leave"
    assert await sweep.index() == set()


async def test_groups_at_one_rate_judge_the_same_conversations_a_salted_one_its_own_each_keeping_its_choice(
        sweep: Sweep) -> None:
    # The spec: the keep-or-skip decision is made once per (conversation, group) and stays
    # stable across sweep ticks - a conversation that grows is kept or skipped as before. Groups
    # at the same rate keep the same conversations (comparable); a salt gives a sample of its own.
    groups = [session_group(sweep.project, g, rate=0.5) for g in ("g-a", "g-b")]
    groups.append(session_group(sweep.project, "g-own", rate=0.5, salt="own"))
    sweeper = sweep.sweeper(sweep.catalog(*groups))
    sessions = [f"s-{i}" for i in range(24)]
    expected = {(g.id, s) for g in groups for s in sessions
                if reference_keep(s, 0.5, (g.online.sample_salt if g.online else None) or "")}
    same = {s for g, s in expected if g == "g-a"}
    assert 0 < len(same) < len(sessions) and same == {s for g, s in expected if g == "g-b"}
    assert {s for g, s in expected if g == "g-own"} != same
    t0 = time.time()
    for s in sessions:
        await sweep.add_turns(s, 2, at=t0 - 5)
    assert await sweeper.sweep_once(now=t0) == len(expected)
    for s in sessions:
        await sweep.store.add_turns([turn(sweep.project, s, 3)], now=t0 + 1)
    assert await sweeper.sweep_once(now=t0 + 6) == len(expected)
    judged = await sweep.ratings(2 * len(expected))
    assert {(g, s) for g, s, turns in judged if turns == 2} == expected
    assert {(g, s) for g, s, turns in judged if turns == 3} == expected, "the same choice at 3 turns"


async def test_only_projects_with_live_session_groups_are_swept_and_each_one_counts(sweep: Sweep) -> None:
    p = sweep.project
    trace_scope = ScorerGroup.model_validate({
        "id": "per-trace", "name": "Per trace", "projectId": f"{p}-trace",
        "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": None, "severity": "low"},
        "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]})
    offline = ScorerGroup.model_validate({
        "id": "offline", "name": "Offline", "projectId": f"{p}-offline",
        "members": [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]})
    paused = session_group(f"{p}-paused", "paused", enabled=False)
    catalog = sweep.catalog(session_group(p, "conv"), session_group(f"{p}-other", "conv-other"),
                            trace_scope, offline, paused)
    now = time.time()
    for project in (p, f"{p}-other", f"{p}-trace", f"{p}-offline", f"{p}-paused"):
        await sweep.add_turns("s-1", 2, at=now - 5, project=project)
    with capture_logs() as logs:
        assert await sweep.sweeper(catalog).sweep_once(now=now) == 2, "one session in each session-scope project"
    assert [e for e in logs if e["log_level"] == "error"] == []
    assert await sweep.index(p) == await sweep.index(f"{p}-other") == set()
    for project in (f"{p}-trace", f"{p}-offline", f"{p}-paused"):
        assert await sweep.index(project) == {"s-1"}, f"{project} is never swept"


async def test_one_projects_unreadable_index_never_stops_the_others(sweep: Sweep) -> None:
    bad = f"a-{sweep.project}"  # swept first: projects go in order
    catalog = sweep.catalog(session_group(bad, "conv-bad"), session_group(sweep.project, "conv"))
    now = time.time()
    await sweep.redis.zadd(keys.session_activity(bad), {b"\xff\xfe not text": now - 5})
    await sweep.add_turns("s-1", 2, at=now - 5)
    try:
        with capture_logs() as logs:
            assert await sweep.sweeper(catalog).sweep_once(now=now) == 1
    finally:
        await sweep.redis.delete(keys.session_activity(bad))
    assert await sweep.ratings(1) == [("conv", "s-1", 2)]
    (failed,) = [e for e in logs if e["log_level"] == "error"]
    assert failed["event"] == "sweeping a project's sessions failed; the other projects go on"
    assert failed["project"] == bad and failed["exc_info"] is True


@pytest.fixture(scope="module")
def judge_server() -> Iterator[JudgeServer]:
    with JudgeServer() as server:
        yield server


async def test_two_conversations_asking_the_same_are_judged_with_one_call_and_one_reservation(
        sweep: Sweep, judge_server: JudgeServer) -> None:
    # The verdict cache at session scope: s-1 and s-2 say the same turns, so the same question to
    # the same judge - one call, one slot of a budget of one, and both conversations rated.
    judges = JudgeClient(judge_server.base_url, timeout_s=10)
    catalog = sweep.catalog(
        session_group(sweep.project, members=[{"kind": "judge", "refId": "quality", "weight": 1, "gate": False}]),
        judges={"quality": Judge(id="quality", name="Quality", criteria=f"Helpful? {sweep.project}")},
        budgets={sweep.project: Budget(project_id=sweep.project, judge_calls_per_window=1, window_seconds=60)})
    claims = Claims(sweep.redis)
    now = time.time()
    await sweep.add_turns("s-1", 2, at=now - 6)
    await sweep.add_turns("s-2", 2, at=now - 5)
    calls = len(judge_server.requests)
    try:
        assert await sweep.sweeper(catalog, panel=Panel(judges=judges, verdict_cache=CachePolicy()),
                                   claims=claims).sweep_once(now=now) == 2
        after = time.time()
    finally:
        await judges.close()
    assert len(judge_server.requests) - calls == 1, "one call for the two"
    rated = {r["sessionId"]: r["members"][0] for r in await sweep.published(2)}
    assert set(rated) == {"s-1", "s-2"} and rated["s-1"]["native"] == rated["s-2"]["native"]
    assert [rated[s].get("cachedFrom") for s in ("s-1", "s-2")] == [None, next(
        r["id"] for r in await sweep.published(2) if r["sessionId"] == "s-1")], "s-2's verdict was s-1's"
    used = [await claims.budget_used(sweep.project, 60, now=at) for at in (now, after)]
    assert max(used) == 1, "one slot reserved, of a budget of one"


async def test_judge_calls_come_out_of_the_projects_online_budget(sweep: Sweep, judge_server: JudgeServer) -> None:
    # One judge call per minute: of two conversations due, one is judged and the group is
    # skipped for the other rather than scored on a partial panel.
    judges = JudgeClient(judge_server.base_url, timeout_s=10)
    catalog = sweep.catalog(
        session_group(sweep.project, members=[{"kind": "judge", "refId": "quality", "weight": 1, "gate": False}]),
        judges={"quality": Judge(id="quality", name="Quality", criteria="Helpful?")},
        budgets={sweep.project: Budget(project_id=sweep.project, judge_calls_per_window=1, window_seconds=60)})
    events = Recorded()
    claims = Claims(sweep.redis)
    now = time.time()
    await sweep.add_turns("s-1", 2, at=now - 6)
    await sweep.add_turns("s-2", 2, at=now - 5)
    history = RatingsStore(sweep.redis)
    before = (await history.history("conv", "1h")).skipped  # group ids are shared: this sweep's own increase
    try:
        with capture_logs() as logs:
            assert await sweep.sweeper(catalog, panel=Panel(judges=judges), claims=claims,
                                       events=events).sweep_once(now=now) == 1
        after = time.time()
    finally:
        await judges.close()
    assert await sweep.ratings(1) == [("conv", "s-1", 2)]
    assert events.kept_pairs == [(sweep.project, "conv")]
    assert events.skipped == [(sweep.project, "conv", "budget")]
    assert (await history.history("conv", "1h")).skipped == before + 1, "the ratings history shows the skip"
    (skipped,) = [e for e in logs if e["event"] == "judge budget exhausted; group skipped"]
    assert (skipped["group"], skipped["session"], skipped["log_level"]) == ("conv", "s-2", "warning")
    used = [await claims.budget_used(sweep.project, 60, now=at) for at in (now, after)]
    assert max(used) == 1, "the call counts in the project's 60 s window"


async def test_a_judged_session_is_recorded_for_the_sdk_and_a_redelivery_judges_nothing(
        sweep: Sweep, unique: str) -> None:
    session = f"s-{unique}"  # session scores are kept by session id
    claims = Claims(sweep.redis)
    sweeper = sweep.sweeper(sweep.catalog(), claims=claims)
    now = time.time()
    await sweep.add_turns(session, 2, at=now - 5)
    with capture_logs() as logs:
        assert await sweeper.sweep_once(now=now) == 1
    (rating,) = await sweep.published(1)
    assert await RatingsStore(sweep.redis).session_scores(session) == [{
        "kind": "scorer-group:conv", "rating": rating["rating"], "justification": rating["justification"],
        "scoredAt": pytest.approx(datetime.fromisoformat(rating["scoredAt"]).timestamp())}]
    assert (await claims.stored(sweep.claim(session, 2))).split("@")[0] == f"done:{rating['id']}"  # @<group revision>
    assert [(e["event"], e["pairs"]) for e in logs if e["log_level"] == "info"] == [("sessions judged", 1)]
    await sweep.add_turns(session, 2, at=now - 5)  # the same turns again: a redelivery
    assert await sweep.index() == {session}
    assert await sweeper.sweep_once(now=now) == 0, "done at this length: no second verdict"
    assert await sweep.index() == set()


class GrowsWhileJudged(SessionStore):
    """The real store, where a new turn of a session arrives right after the sweep has read it."""

    def __init__(self, sweep: Sweep, session: str, at: float) -> None:
        super().__init__(sweep.redis)
        self.pending: Trace | None = turn(sweep.project, session, 3)
        self.at = at

    async def quiet(self, project_id: str, quiet_for_s: float, now: float | None = None,
                    offset: int = 0, limit: int = 200) -> list[QuietSession]:
        found = await super().quiet(project_id, quiet_for_s, now, offset, limit)
        if self.pending is not None:
            await self.add_turns([self.pending], now=self.at)
            self.pending = None
        return found


async def test_a_session_that_grows_while_it_is_judged_is_judged_again_at_its_new_length(sweep: Sweep) -> None:
    t0 = float(int(time.time()))
    store = GrowsWhileJudged(sweep, "s-1", at=t0 + 5)
    sweeper = sweep.sweeper(sweep.catalog(session_group(sweep.project, idle=5)), store=store)
    await sweep.add_turns("s-1", 2, at=t0)
    assert await sweeper.sweep_once(now=t0 + 5) == 1, "judged at the 2 turns it read"
    assert await sweep.index() == {"s-1"}, "its third turn keeps it in the index"
    assert await sweeper.sweep_once(now=t0 + 10) == 1
    assert await sweep.ratings(2) == [("conv", "s-1", 2), ("conv", "s-1", 3)]
