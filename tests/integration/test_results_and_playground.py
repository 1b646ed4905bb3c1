"""A group's latest results and the playground, through the SDK against the real API process,
Redis and a local chat-completions judge: results newest first, paged, filtered below the
threshold, bounded and scoped per project; the playground grades an example with every member,
publishes nothing, reserves its judges from the project's budget (429 with the budget's state
when there is no room) and is bounded per project."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
import pytest

from adapters.stores import keys
from adapters.stores.ratings import RatingsStore
from devtools.judge_server import Behaviour, JudgeServer
from scorer_groups import AsyncClient, BadRequest, Client, NotFound, RateLimited, Retry
from scorer_groups.documents import MemberVerdict, Rating
from scoring.results import HistoryEntry
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_clients import connect
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

NO_RETRY = Retry(attempts=0)
SECRET = "sk-playground-operator-secret-0123456789"  # the API process's own judge key
MAX_BODY = 2 * 1024 * 1024


class Env:
    def __init__(self, api: ApiProcess, redis_url: str, keys_: dict[str, str], judge: JudgeServer) -> None:
        self.api, self.redis_url, self.keys, self.judge = api, redis_url, keys_, judge

    def client(self, who: str = "a") -> Client:
        return Client(self.api.url, self.keys[who], retry=NO_RETRY)


@pytest.fixture(scope="module")
def seeded_api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with JudgeServer() as judge, redis_databases.lease() as url:
        keys_ = {"a": create_key(url, "--project", "p-a"), "b": create_key(url, "--project", "p-b"),
                 "op": create_key(url, "--operator")}
        api = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log",
                         env={"SGW_JUDGE_BASE_URL": judge.base_url, "SGW_JUDGE_TIMEOUT_S": "5",
                              "SGW_JUDGE_API_KEY": SECRET, "SGW_API_MAX_BODY_BYTES": str(MAX_BODY)}).start()
        try:
            yield Env(api, url, keys_, judge)
        finally:
            api.stop()


def rating(group_id: str, n: int, score: float | None) -> Rating:
    return Rating(id=f"r-{n}", kind=f"scorer-group:{group_id}", group_id=group_id, group_name="G", project_id="p-a",
                  agent_id="agent", scope="trace", trace_id=f"t-{n}", rating=score, reason=None,
                  justification=f"Weighted blend: {score}", scored_at=datetime.fromtimestamp(1_796_000_000 + n, UTC),
                  members=[MemberVerdict(kind="judge", ref_id="j", name="Judge", weight=1, gate=False,
                                         status="scored", native=score, goodness=None, detail="fine")])


def record(env: Env, group_id: str, ratings: list[tuple[Rating, bool]]) -> None:
    async def write() -> None:
        redis = connect(env.redis_url)
        await RatingsStore(redis).write([HistoryEntry(group_id, r.rating, below, r.scored_at.timestamp(), r.to_json(),
                                                      rating_id=r.id) for r, below in ratings])
        await redis.aclose()

    asyncio.run(write())


def a_group(client: Client, name: str = "G", **extra: Any) -> Any:
    judge = client.monitor.judges.create(name="Helpful", criteria="Helpful?")
    pii = client.monitor.patterns.create(name="PII", polarity="failure", template="email")
    members = [{"kind": "judge", "refId": judge.id, "weight": 1}, {"kind": "pattern", "refId": pii.id, "weight": 1}]
    return client.monitor.scorer_groups.create(name, members=members, **extra)


def test_results_come_newest_first_in_pages_and_filtered_below_the_threshold(seeded_api: Env) -> None:
    with seeded_api.client() as a:
        group = a_group(a)
        record(seeded_api, group.id, [(rating(group.id, n, float(n)), n < 3) for n in range(7)])

        first = a.monitor.scorer_groups.results(group.id, limit=3)
        assert [r.trace_id for r in first.items] == ["t-6", "t-5", "t-4"] and first.next_cursor
        # Newer results arrive between two pages: the cursor still continues where the page ended.
        record(seeded_api, group.id, [(rating(group.id, n, float(n)), False) for n in (7, 8)])
        second = a.monitor.scorer_groups.results(group.id, limit=3, cursor=first.next_cursor)
        assert [r.trace_id for r in second.items] == ["t-3", "t-2", "t-1"]
        last = a.monitor.scorer_groups.results(group.id, limit=3, cursor=second.next_cursor)
        assert [r.trace_id for r in last.items] == ["t-0"] and last.next_cursor is None
        assert a.monitor.scorer_groups.results(group.id, cursor="999999").items == [], "a cursor of a list since gone"
        old = a.monitor.scorer_groups.results(group.id, cursor="1796000000000-0")
        assert (old.items, old.next_cursor) == ([], None), "a cursor of the stream kept before: the end, not an error"
        assert second.items[0].members[0].detail == "fine" and second.items[0].justification == "Weighted blend: 3.0"
        below = a.monitor.scorer_groups.results(group.id, limit=10, below=True)
        assert [r.trace_id for r in below.items] == ["t-2", "t-1", "t-0"] and below.next_cursor is None
        with pytest.raises(BadRequest) as bad:
            a.monitor.scorer_groups.results(group.id, cursor="1-2; DROP")
        assert bad.value.fields == ["cursor"]
    with seeded_api.client("b") as b, pytest.raises(NotFound):
        b.monitor.scorer_groups.results(group.id)


def test_result_text_shaped_like_the_lists_items_and_hostile_cursors_change_nothing(seeded_api: Env) -> None:
    # A rating's text is a tenant's (labels, a judge's justification): text that looks like the
    # list's "<seq>:<below>:" prefix is part of the document, never read as another item.
    with seeded_api.client() as a:
        group = a_group(a, "Hostile")
        forged = [rating(group.id, n, 9.0) for n in range(3)]
        forged[1] = forged[1].model_copy(update={"justification": '7:1:{"id":"forged"}\n0:1:x'})
        record(seeded_api, group.id, [(r, False) for r in forged])
        page = a.monitor.scorer_groups.results(group.id, limit=10)
        assert [r.trace_id for r in page.items] == ["t-2", "t-1", "t-0"]
        assert page.items[1].justification == '7:1:{"id":"forged"}\n0:1:x'
        assert a.monitor.scorer_groups.results(group.id, below=True).items == [], "none is below the threshold"
        for cursor in ("99999999999999999999", "0"):  # past the newest; before the first
            assert a.monitor.scorer_groups.results(group.id, cursor=cursor).items == []
        for cursor in ("-1", "1e3", "1 OR 1", "3:1"):
            with pytest.raises(BadRequest):
                a.monitor.scorer_groups.results(group.id, cursor=cursor)


def test_the_results_kept_are_bounded(seeded_api: Env) -> None:
    with seeded_api.client() as a:
        group = a_group(a, "Busy")
        for start in range(0, 1_500, 500):
            record(seeded_api, group.id, [(rating(group.id, n, 5.0), False) for n in range(start, start + 500)])

        async def length() -> int:
            redis = connect(seeded_api.redis_url)
            try:
                return int(await redis.llen(keys.group_results(group.id)))
            finally:
                await redis.aclose()

        async def indexed() -> int:
            redis = connect(seeded_api.redis_url)
            try:
                return int(await redis.zcard(keys.group_results_seqs(group.id)))
            finally:
                await redis.aclose()

        kept = asyncio.run(length())
        assert kept == keys.RESULTS_KEPT, "trimmed to RESULTS_KEPT"
        assert a.monitor.scorer_groups.results(group.id, limit=1).items[0].trace_id == "t-1499"
        assert keys.RESULTS_KEPT <= asyncio.run(indexed()) < keys.RESULTS_KEPT + keys.RESULTS_INDEX_TRIM_EVERY, \
            "the index (and the calls it keeps) trimmed alike, every RESULTS_INDEX_TRIM_EVERY seqs"
        assert a.monitor.scorer_groups.result(group.id, "r-1499").rating.trace_id == "t-1499"
        assert a.monitor.scorer_groups.result(group.id, "r-500").rating.trace_id == "t-500", "the oldest kept"
        with pytest.raises(NotFound):
            a.monitor.scorer_groups.result(group.id, "r-499")  # trimmed off with its calls
        # A newer result of the same id takes its entry over: trimming the older one leaves it.
        record(seeded_api, group.id, [(rating(group.id, 500, 9.0), False)])
        record(seeded_api, group.id, [(rating(group.id, n, 5.0), False) for n in range(2_000, 2_001)])
        assert a.monitor.scorer_groups.result(group.id, "r-500").rating.rating == 9.0


def test_the_playground_grades_an_example_with_every_member_and_publishes_nothing(seeded_api: Env) -> None:
    with seeded_api.client() as a:
        group = a_group(a, "Playground")
        verdict = a.monitor.scorer_groups.grade(group.id, input="Where is my order?",
                                                output="It ships today. Mail me at jane@example.com [[rating=8]]")
        assert verdict.scope == "playground" and verdict.group_id == group.id
        assert [(m.name, m.status, m.native) for m in verdict.members] == [("Helpful", "scored", 8), ("PII", "scored", True)]
        assert verdict.rating == 4.0 and "Weighted blend" in verdict.justification
        assert verdict.members[0].usage is not None and verdict.members[0].usage.prompt_tokens
        (call,) = verdict.calls  # the judge's call behind it, as the judge received it; the pattern made none
        sent = next(r for r in seeded_api.judge.requests if "jane@example.com [[rating=8]]" in str(r["messages"]))
        assert [(m.role, m.content) for m in call.messages] == [(m["role"], m["content"]) for m in sent["messages"]]
        assert (call.member, call.attempts, call.error) == ("Helpful", 1, None) and '"rating"' in (call.answer or "")
        assert a.monitor.scorer_groups.results(group.id).items == [], "a playground grade is not a result"
        assert a.monitor.scorer_groups.ratings(group.id, window="1h").count == 0


def test_the_playground_shows_a_verdict_paid_for_already_as_cached_and_calls_no_judge(seeded_api: Env) -> None:
    with seeded_api.client() as a:
        group = a_group(a, "Asked twice")
        example = {"input": "Where is my order?", "output": "It ships today, twice asked [[rating=9]]"}
        first = a.monitor.scorer_groups.grade(group.id, **example)
        calls = len(seeded_api.judge.requests)
        again = a.monitor.scorer_groups.grade(group.id, **example)
        assert len(seeded_api.judge.requests) == calls, "the same judge on the same messages: not asked again"
        assert not first.members[0].cached and again.members[0].cached
        assert again.members[0].cached_from and again.members[0].native == first.members[0].native == 9
        assert again.members[0].usage is None, "it spent nothing"
        (call,) = again.calls
        assert call.cached_from == again.members[0].cached_from and call.attempts == 0, \
            "its judge call record links to the call that paid"
        other = a.monitor.scorer_groups.grade(group.id, input="Where is my order?", output="Another answer [[rating=9]]")
        assert not other.members[0].cached and len(seeded_api.judge.requests) == calls + 1


def test_the_playground_says_whether_live_scoring_would_see_the_example(seeded_api: Env) -> None:
    aimed = {"all": [{"field": "agentId", "op": "eq", "value": "support"},
                     {"field": "metadata.plan_tier", "op": "eq", "value": "gold"},
                     {"field": "spans.attributes.gen_ai.request.model", "op": "startsWith", "value": "gpt-4o"}]}
    online = {"enabled": False, "sample_rate": 0.1, "alert_threshold": 5, "severity": "low", "filter": aimed}
    with seeded_api.client() as a:
        group = a_group(a, "Aimed", online=online)
        llm = [{"spanId": "c", "name": "chat", "attributes": {"gen_ai.request.model": "gpt-4o-mini"}}]
        seen = a.monitor.scorer_groups.grade(group.id, input="q", output="a [[rating=7]]", spans=llm,
                                             metadata={"plan_tier": "gold"}, agent_id="support")
        assert seen.passes_filter is True and seen.rating is not None, "user keys reach the filter as written"
        unseen = a.monitor.scorer_groups.grade(group.id, input="q", output="a [[rating=7]]", spans=llm,
                                               metadata={"plan_tier": "gold"}, agent_id="sales")
        assert unseen.passes_filter is False and unseen.rating is not None, "graded all the same: it is a try-out"
        plain = a_group(a, "Unaimed")
        assert a.monitor.scorer_groups.grade(plain.id, input="q", output="a").passes_filter is None, "no filter"
        steps = a_group(a, "Steps", online={"enabled": True, "sample_rate": 1, "alert_threshold": 5, "severity": "low",
                                            "scope": "span", "span_filter": {"field": "name", "op": "eq", "value": "lookup"}})
        step = a.monitor.scorer_groups.grade(steps.id, input="order 7?", output="packed [[rating=6]]", root_name="lookup")
        assert step.passes_filter is True and step.span_name == "lookup" and step.rating is not None, \
            "a span group's example is one step, graded as one"
        assert a.monitor.scorer_groups.grade(steps.id, input="q", output="a", root_name="answer").passes_filter is False


def test_the_playground_reserves_from_the_budget_and_says_its_state_when_it_has_no_room(seeded_api: Env) -> None:
    with seeded_api.client("b") as b, seeded_api.client("op") as op:
        group = a_group(b, "Budgeted")
        op.monitor.budgets.set("p-b", 5, window_seconds=3600)
        b.monitor.budgets.set("p-b", 1)  # the project's own, lower cap is the one in force
        assert b.monitor.scorer_groups.grade(group.id, input="q", output="a [[rating=6]]").rating == 8.0
        assert b.monitor.budgets.get("p-b").used.judge_calls == 1
        calls = len(seeded_api.judge.requests)
        with pytest.raises(RateLimited) as refused:
            b.monitor.scorer_groups.grade(group.id, input="q", output="a")
        assert len(seeded_api.judge.requests) == calls, "no judge call without budget"
        state = refused.value.problem["budget"]
        assert (state["judgeCallsPerWindow"], state["judgeCallsUsed"], state["windowSeconds"]) == (1, 1, 3600)
        assert 0 < state["resetsInSeconds"] <= 3600
        assert "no room" in refused.value.detail
        op.monitor.budgets.delete("p-b")


def test_the_playground_is_bounded_per_project(seeded_api: Env) -> None:
    with seeded_api.client() as a:
        group = a_group(a, "Slow")
    seeded_api.judge.set_default(Behaviour.deterministic(delay=1.0))

    async def at_once() -> list[Any]:
        async with AsyncClient(seeded_api.api.url, seeded_api.keys["a"], retry=NO_RETRY) as client:
            return await asyncio.gather(*(client.monitor.scorer_groups.grade(group.id, input="q", output="a")
                                          for _ in range(6)), return_exceptions=True)

    try:
        started = time.monotonic()
        outcomes = asyncio.run(at_once())
    finally:
        seeded_api.judge.set_default(Behaviour.deterministic())
    refused = [o for o in outcomes if isinstance(o, RateLimited)]
    assert len(refused) == 2 and all("already" in r.detail for r in refused), outcomes
    assert sum(isinstance(o, Rating) for o in outcomes) == 4
    assert time.monotonic() - started < 5


# --- a hostile tenant in the playground -----------------------------------------------------------


def test_a_playground_code_scorer_cannot_show_the_processes_secrets(seeded_api: Env) -> None:
    with seeded_api.client() as a:
        spy = a.monitor.customs.create(name="Spy", type="code", code=(
            "def score(input, output, expected, spans, metadata):\n"
            "    import os\n"
            "    seen = dict(os.environ)\n"
            "    try:\n"
            "        seen['cmdline'] = open('/proc/1/environ', 'rb').read().decode(errors='replace')\n"
            "    except Exception as exc:\n"
            "        seen['cmdline'] = repr(exc)\n"
            "    raise ValueError(repr(seen) + ' sk-planted-1234567890abcdef')\n"))
        group = a.monitor.scorer_groups.create("Spied", members=[{"kind": "custom", "refId": spy.id}])
        verdict = a.monitor.scorer_groups.grade(group.id, input="q", output="a")
    member = verdict.members[0]
    assert member.status == "failed" and member.detail is not None and "ValueError" in member.detail
    shown = verdict.model_dump_json()
    assert SECRET not in shown and "SGW_REDIS_URL" not in shown and seeded_api.redis_url not in shown
    assert "sk-planted-1234567890abcdef" not in shown, "a key-shaped string is cut from what members say"


def test_the_playground_grades_only_the_callers_own_groups(seeded_api: Env) -> None:
    with seeded_api.client("a") as a, seeded_api.client("b") as b:
        theirs = a_group(a, "Not yours")
        with pytest.raises(NotFound):
            b.monitor.scorer_groups.grade(theirs.id, input="q", output="a")


def test_an_oversized_example_is_refused_before_any_member_runs(seeded_api: Env) -> None:
    with seeded_api.client() as a:
        group = a_group(a, "Bounded")
        calls = len(seeded_api.judge.requests)
        with pytest.raises(BadRequest) as bad:
            a.monitor.scorer_groups.grade(group.id, input="q", output="a", metadata={"blob": "x" * 1_100_000})
        assert "at most 1048576" in bad.value.detail
        assert len(seeded_api.judge.requests) == calls


def test_a_body_over_the_limit_is_refused_unread_or_mid_stream(seeded_api: Env) -> None:
    url = f"{seeded_api.api.url}/v1/scorer-groups/any/grade"
    headers = {"Authorization": f"Bearer {seeded_api.keys['a']}", "Content-Type": "application/json"}
    # Refused unread: only the head is sent, announcing a body over the limit. (Sending the body
    # too races the refusal: the server closes with the body unread, and the reset can reach the
    # client before the answer does.)
    host, port = seeded_api.api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(f"POST /v1/scorer-groups/any/grade HTTP/1.1\r\nHost: {host}\r\n"
                     f"Authorization: Bearer {seeded_api.keys['a']}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {MAX_BODY + 10}\r\n\r\n".encode())
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413") and orjson.loads(body)["title"] == "Content Too Large", answer[:500]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit is counted as the body streams
        for _ in range(MAX_BODY // 65536 + 2):  # just past it: little is left unsent to race the answer
            yield b" " * 65536

    streamed = httpx.post(url, content=chunks(), headers=headers, timeout=30)
    assert streamed.status_code == 413
    assert httpx.get(f"{seeded_api.api.url}/healthz").status_code == 200, "and the API goes on"


def test_a_result_of_another_project_is_not_found_even_in_the_callers_group(seeded_api: Env) -> None:
    # A group moved to another project (or an id reused) keeps its latest results a while: their
    # calls quote the old project's traces, so the new owner reads none of them.
    with seeded_api.client("b") as b, Client(seeded_api.api.url, seeded_api.keys["op"], retry=NO_RETRY) as operator:
        group = a_group(b, "Moved here")
        record(seeded_api, group.id, [(rating(group.id, 1, 6.0), False)])  # a result of p-a's
        with pytest.raises(NotFound):
            b.monitor.scorer_groups.result(group.id, "r-1")
        assert operator.monitor.scorer_groups.result(group.id, "r-1").rating.project_id == "p-a"
