"""The SDK against the real API process and Redis: the spec's snippets verbatim (only the client
is constructed here), typed errors with the problem body, retries on 429/503, the async twin,
and the scorers, budgets and channels."""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore, SessionVerdict
from scorer_groups import (
    AsyncClient,
    BadRequest,
    Budget,
    Client,
    NotFound,
    PreconditionFailed,
    Ratings,
    Retry,
    ScorerGroup,
    ServerError,
    Unauthorized,
)
from scoring.claim_request import ClaimRequest, day_of
from tests.support.api_process import ApiProcess, cli, create_key
from tests.support.http_fakes import Reply, ScriptedServer
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases
from tests.support.spec_snippets import CREATE_SNIPPET, SCORES_SNIPPET, SESSION_SNIPPET, SPEC, TRACE_SNIPPET

pytestmark = pytest.mark.integration

class Env:
    def __init__(self, process: ApiProcess, redis_url: str, keys: dict[str, str]) -> None:
        self.process, self.redis_url, self.keys = process, redis_url, keys

    def client(self, who: str, **kwargs: Any) -> Client:
        return Client(self.process.url, self.keys[who], **kwargs)


@pytest.fixture(scope="module")
def env(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with redis_databases.lease() as url:
        keys = {"a": create_key(url, "--project", "p-a"), "b": create_key(url, "--project", "p-b"),
                "op": create_key(url, "--operator")}
        process = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log").start()
        try:
            yield Env(process, url, keys)
        finally:
            process.stop()


def test_snippets_are_the_specs() -> None:
    if not SPEC.exists():
        pytest.skip(f"the spec is not next to the repository ({SPEC})")
    spec = SPEC.read_text()
    for snippet in (CREATE_SNIPPET, TRACE_SNIPPET, SESSION_SNIPPET, SCORES_SNIPPET):
        assert snippet in spec


def test_the_specs_snippets_run_unchanged(env: Env) -> None:
    client = env.client("a")  # the only line the spec leaves to the reader
    quality = client.monitor.judges.create(name="Quality", criteria="Helpful?")
    safety = client.monitor.judges.create(name="Safety", criteria="Safe?")
    pii = client.monitor.patterns.create(name="PII", polarity="failure", template="email")
    names: dict[str, Any] = {"client": client, "quality": quality, "safety": safety, "pii": pii}

    exec(CREATE_SNIPPET, names)
    group = names["group"]
    assert isinstance(group, ScorerGroup) and group.name == "Release quality bar"
    assert [(m.ref_id, m.weight, m.gate) for m in group.members] == [
        (quality.id, 1, False), (safety.id, 1, True), (pii.id, 0, True)]
    assert group.project_id == "p-a" and group.online is None

    exec(TRACE_SNIPPET, names)
    live = client.monitor.scorer_groups.get(group.id)
    assert live.online is not None
    assert (live.online.enabled, live.online.sample_rate, live.online.alert_threshold, live.online.severity,
            live.online.scope) == (True, 0.2, 6, "high", "trace")
    chart = eval('client.monitor.scorer_groups.ratings(group.id, window="7d")', names)
    assert isinstance(chart, Ratings) and chart.window == "7d" and len(chart.buckets) == 168

    exec(SESSION_SNIPPET, names)
    session = client.monitor.scorer_groups.get(group.id)
    assert session.online is not None
    assert (session.online.scope, session.online.sample_rate, session.online.idle_seconds) == ("session", 1.0, 120)

    async def verdict() -> None:
        redis = connect(env.redis_url)
        await RatingsStore(redis).write([], [SessionVerdict("s-42", group.id, 4.5, "Weighted blend: ...",
                                                             time.time())])
        await redis.aclose()

    names["session_id"] = "s-42"
    # Before any verdict (one turn so far, or still within idleSeconds): an empty list, no error.
    assert eval(SCORES_SNIPPET.splitlines()[0], names) == []
    asyncio.run(verdict())
    scores = eval(SCORES_SNIPPET.splitlines()[0], names)
    assert [(s["kind"], s["rating"], s["justification"]) for s in scores] == [
        (f"scorer-group:{group.id}", 4.5, "Weighted blend: ...")]
    client.close()


def test_errors_are_typed_and_carry_the_problem(env: Env) -> None:
    with env.client("a") as a, env.client("b") as b:
        judge = a.monitor.judges.create(name="Q", criteria="?")
        with pytest.raises(BadRequest) as bad:
            a.monitor.scorer_groups.create("G", members=[{"kind": "judge", "refId": judge.id},
                                                         {"kind": "judge", "refId": "nope"}])
        assert bad.value.status == 400 and "members[1].refId" in bad.value.fields
        assert bad.value.problem["status"] == 400 and "no LLM judge" in bad.value.detail
        group = a.monitor.scorer_groups.create("G", members=[{"kind": "judge", "refId": judge.id}])
        with pytest.raises(BadRequest, match="missing: enabled, alertThreshold, severity"):
            a.monitor.scorer_groups.update(group.id, online={"sampleRate": 0.5})
        with pytest.raises(NotFound) as missing:
            b.monitor.scorer_groups.get(group.id)
        assert missing.value.status == 404
        with pytest.raises(PreconditionFailed):
            a.monitor.scorer_groups.update(group.id, name="X", if_match='"stale"')
        assert a.monitor.scorer_groups.update(group.id, description=None, name="G2").name == "G2"
        assert [c.action for c in a.monitor.scorer_groups.changes(group.id)] == ["updated", "created"]
        a.monitor.scorer_groups.delete(group.id)
        assert group.id not in [g.id for g in a.monitor.scorer_groups.list()]
    key = create_key(env.redis_url, "--project", "p-a")
    with Client(env.process.url, key) as c:
        c.monitor.scorer_groups.list()
        assert cli(env.redis_url, "keys", "revoke", key.split("_")[1]).returncode == 0
        with pytest.raises(Unauthorized):
            c.monitor.scorer_groups.list()


def test_retries_429_and_503_with_backoff_then_gives_up_with_the_problem() -> None:
    group = {"id": "g1", "name": "G", "projectId": "p", "description": None, "online": None,
             "members": [{"kind": "judge", "refId": "j", "weight": 1, "gate": False}]}
    problem = {"type": "about:blank", "title": "Unavailable", "status": 503, "detail": "try later"}
    with ScriptedServer(default=Reply(503, problem)) as server:
        server.script(Reply(503, problem), Reply(429, {"detail": "slow down"}, {"Retry-After": "0"}),
                      Reply(201, group))
        with Client(server.url, "sgw_x_y", retry=Retry(attempts=3, backoff_s=0.01)) as client:
            made = client.monitor.scorer_groups.create("G", members=[{"kind": "judge", "refId": "j"}])
            assert made.id == "g1" and len(server.requests) == 3
            assert all(r.headers["authorization"] == "Bearer sgw_x_y" for r in server.requests)
            with pytest.raises(ServerError) as failed:
                client.monitor.scorer_groups.create("G", members=[{"kind": "judge", "refId": "j"}])
            assert failed.value.status == 503 and failed.value.problem == problem
            assert len(server.requests) == 3 + 4, "the first try and three retries"


async def test_the_async_twin(env: Env) -> None:
    async with AsyncClient(env.process.url, env.keys["a"]) as client:
        judge = await client.monitor.judges.create(name="Async", criteria="?")
        group = await client.monitor.scorer_groups.create("Async", members=[{"kind": "judge", "refId": judge.id}])
        assert (await client.monitor.scorer_groups.get(group.id)) == group
        updated = await client.monitor.scorer_groups.update(group.id, online={
            "enabled": True, "sampleRate": 0.5, "alertThreshold": None, "severity": "low"})
        assert updated.online is not None and updated.online.sample_rate == 0.5
        assert group.id in [g.id for g in await client.monitor.scorer_groups.list()]
        await client.monitor.scorer_groups.delete(group.id)
        with pytest.raises(NotFound):
            await client.monitor.scorer_groups.get(group.id)


def test_scorers_budgets_and_channels(env: Env) -> None:
    secret = "whsec_" + base64.b64encode(os.urandom(32)).decode()
    with env.client("a") as a, env.client("b") as b:
        code = a.monitor.customs.create(name="Short", type="code",
                                        code="def score(input, output, **kw):\n    return 1.0\n")
        external = a.monitor.customs.create(name="Remote", type="external", url="https://scorer.example.com/s")
        assert {code.id, external.id} <= {c.id for c in a.monitor.customs.list()}
        renamed = a.monitor.customs.update(external.id, invert=True, timeout_ms=2000)
        assert (renamed.invert, renamed.timeout_ms, renamed.url) == (True, 2000, "https://scorer.example.com/s")
        with pytest.raises(NotFound):
            b.monitor.customs.get(code.id)
        a.monitor.customs.delete(code.id)
        with env.client("op") as op:
            op.monitor.budgets.set("p-a", 500, window_seconds=60)
        budget = a.monitor.budgets.set("p-a", 400, window_seconds=60)  # the project lowers its own
        assert (budget.judge_calls_per_window, budget.project_judge_calls_per_window, budget.window_seconds,
                budget.calls_cap) == (500, 400, 60, 400)
        shown = a.monitor.budgets.get("p-a")
        assert Budget.model_validate(shown.model_dump(exclude={"used"})) == budget and shown.used.judge_calls == 0
        with pytest.raises(NotFound):
            b.monitor.budgets.get("p-a")
        channel = a.monitor.channels.create("bot", "https://hooks.example.com/x", secret=secret)
        assert channel.has_secret and secret not in channel.model_dump_json()
        assert a.monitor.channels.get(channel.id) == channel
        with pytest.raises(NotFound):
            b.monitor.channels.get(channel.id)
        a.monitor.channels.delete(channel.id)
        assert a.monitor.channels.list() == []


def test_the_readmes_five_lines_run(env: Env) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("## The SDK\n")[1].split("```python\n")[1].split("```")[0]
    assert len(block.strip().splitlines()) == 5
    names: dict[str, Any] = {"api_key": env.keys["b"]}
    exec(block.replace("http://127.0.0.1:8080", env.process.url), names)
    group = names["client"].monitor.scorer_groups.get(names["group"].id)
    assert group.project_id == "p-b" and group.online is not None and group.online.sample_rate == 0.2
    names["client"].close()


def test_gates_first_is_set_at_creation_and_changed_by_update(env: Env) -> None:
    with env.client("a") as a:
        judge = a.monitor.judges.create(name="J", criteria="?")
        pii = a.monitor.patterns.create(name="PII", polarity="failure", template="email")
        members = [{"kind": "pattern", "refId": pii.id, "weight": 0, "gate": True}, {"kind": "judge", "refId": judge.id}]
        group = a.monitor.scorer_groups.create("Cheap first", members=members, gates_first=True)
        assert group.gates_first and a.monitor.scorer_groups.get(group.id).gates_first
        assert not a.monitor.scorer_groups.update(group.id, gates_first=False).gates_first
        assert not a.monitor.scorer_groups.create("Default", members=members).gates_first, "the spec's default"
        with pytest.raises(BadRequest) as bad:
            a.monitor.scorer_groups.update(group.id, gates_first="yes")
        assert bad.value.fields == ["gatesFirst"]


def test_a_budget_shows_the_calls_and_tokens_its_window_used(env: Env) -> None:
    with env.client("a") as a, env.client("op") as op:
        op.monitor.budgets.set("p-a", 50, window_seconds=3600, judge_tokens_per_window=1_000_000)
        before = a.monitor.budgets.get("p-a")
        request = ClaimRequest(project_id="p-a", group_id="g", subject_key="trace:t-budget", judge_calls=2,
                               calls_cap=50, budget_window_s=3600, judge_tokens=1_500, tokens_cap=1_000_000,
                               day=day_of(time.time()))

        async def spend() -> None:
            redis = connect(env.redis_url)
            claims = Claims(redis)
            (claim,) = await claims.claim_many([request])
            assert claim.state == "claimed"
            await claims.mark_done([(request, "r")], tokens=[(request, 700 - 1_500)])  # 700 reported
            await redis.aclose()

        asyncio.run(spend())
        view = a.monitor.budgets.get("p-a")
        assert view.judge_tokens_per_window == 1_000_000 and view.judge_calls_per_window == 50
        assert (view.used.judge_calls - before.used.judge_calls, view.used.judge_tokens - before.used.judge_tokens) == (2, 700)
        assert view.used.window_seconds == 3600 and view.used.window_start % 3600 == 0
        with env.client("b") as b, pytest.raises(NotFound):
            b.monitor.budgets.get("p-a")
