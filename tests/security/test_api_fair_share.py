"""A hostile tenant with a valid key, against the real API process on the real Redis, with two
projects A and B: it cannot stall the API with a body, take every judge call from another
project, lift its own budget, crash a page with a cursor, or run a third-party script on the
API's origin.

What each guards:
- bodies: the door (worker.api.door) checks the key before reading and holds each route to its
  ceiling; bodies that pass are validated in a parser process (worker.api.bodies), so /healthz
  answers throughout and the API's memory stays bounded;
- judge calls: the fair share of the judge pool (scoring.members.fair_share);
- budgets: budget_write (services.groups) - the operators set a budget, a project only lowers it;
- cursors: worker.api.pages' ASCII-digit numbers;
- /docs: worker.api.docs_pages (Swagger UI from the package, under the console's CSP).
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from devtools.judge_server import Behaviour, JudgeServer
from tests.support.api_process import ApiProcess, create_key
from tests.support.redis_databases import RedisDatabases

pytestmark = pytest.mark.integration

JUDGE_DELAY_S = 3.0
# The API process's peak RSS (VmHWM) after every attack here, with its parser process apart: a
# fresh API is ~110 MB with its sandboxes; the largest body it ever holds is a 3.4 MiB playground
# body (raw and parsed) at a time per parser turn.
RSS_BOUND_MB = 300
READ_TIMEOUT_S = 4  # SGW_API_BODY_READ_TIMEOUT_S of the API under attack


@dataclass
class Env:
    api: ApiProcess
    judge: JudgeServer
    keys: dict[str, str]
    groups: dict[str, str] = field(default_factory=dict)

    def client(self, who: str | None) -> httpx.Client:
        return self.api.client(self.keys[who] if who else None)


@pytest.fixture(scope="module")
def seeded_api(redis_databases: RedisDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with JudgeServer() as judge, redis_databases.lease() as url:
        keys = {"a": create_key(url, "--project", "p-a"), "b": create_key(url, "--project", "p-b"),
                "op": create_key(url, "--operator")}
        api = ApiProcess(url, tmp_path_factory.mktemp("api") / "api.log",
                         env={"SGW_JUDGE_BASE_URL": judge.base_url, "SGW_JUDGE_TIMEOUT_S": "30",
                              "SGW_JUDGE_CONCURRENCY": "16", "SGW_API_BODY_READ_TIMEOUT_S": str(READ_TIMEOUT_S)}
                         ).start()
        try:
            environment = Env(api, judge, keys)
            with environment.client("a") as a, environment.client("b") as b:
                environment.groups["a"] = _group(a, judges=20)
                environment.groups["b"] = _group(b, judges=1)
            yield environment
        finally:
            api.stop()


def _group(client: httpx.Client, judges: int) -> str:
    members = []
    for n in range(judges):
        judge = client.post("/v1/judges", json={"name": f"J{n}", "criteria": f"Helpful ({n})?"})
        assert judge.status_code == 201, judge.text
        members.append({"kind": "judge", "refId": judge.json()["id"]})
    group = client.post("/v1/scorer-groups", json={"name": f"{judges} judges", "members": members})
    assert group.status_code == 201, group.text
    return str(group.json()["id"])


def _peak_rss_mb(pid: int) -> float:
    status = open(f"/proc/{pid}/status").read()
    return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


# What a stalled event loop would show: one of these bodies validated on it holds it for a second
# or more (measured). The API's own account (sgw_event_loop_stall_seconds, worker.loop_stall) is
# read, not a client's timing of /healthz: on a loaded 2-core machine the attacking test process
# itself delayed its /healthz thread by 0.36-0.62 s while the API's loop was free.
STALL_BOUND_S = 0.5  # a bucket bound of the histogram


def _stalls(env: Env) -> tuple[float, float]:
    """The API's event-loop stall histogram: (ticks observed, ticks later than STALL_BOUND_S)."""
    metrics = httpx.get(env.api.url + "/metrics").text
    count = float(re.search(r"^sgw_event_loop_stall_seconds_count (\S+)$", metrics, re.M).group(1))  # type: ignore[union-attr]
    within = float(re.search(rf'^sgw_event_loop_stall_seconds_bucket{{le="{STALL_BOUND_S}"}} (\S+)$',
                             metrics, re.M).group(1))  # type: ignore[union-attr]
    return count, count - within


class LoopWatch:
    """Around an attack: the API's loop ticks and its stalls past the bound, and /healthz asked
    every 50 ms on a thread of this process, each answered 200."""

    def __init__(self, env: Env) -> None:
        self._env, self._stop = env, threading.Event()
        self.asked, self.failed, self.ticks, self.stalls = 0, 0, 0.0, 0.0
        self._before = (0.0, 0.0)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                self.failed += client.get(self._env.api.url + "/healthz").status_code != 200
                self.asked += 1
                self._stop.wait(0.05)

    def __enter__(self) -> LoopWatch:
        self._before = _stalls(self._env)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        after = _stalls(self._env)
        self.ticks, self.stalls = after[0] - self._before[0], after[1] - self._before[1]

    def __repr__(self) -> str:
        return (f"LoopWatch(ticks={self.ticks:g}, stalls past {STALL_BOUND_S} s={self.stalls:g}, "
                f"/healthz asked={self.asked}, not 200={self.failed})")

    def held(self) -> bool:
        """The loop went on ticking, never held past the bound, and answered every /healthz."""
        return self.ticks >= 1 and self.stalls == 0 and self.asked >= 1 and self.failed == 0


# --- bodies --------------------------------------------------------------------------------------


def _elements(n: int, element: bytes = b"0") -> bytes:
    return b'{"input":"x","output":"y","metadata":{"a":[' + b",".join([element] * n) + b"]}}"


BIG = b'{"input":"x","output":"y","metadata":{"a":"' + b"x" * (57 * 1024 * 1024) + b'"}}'  # 57 MiB
MANY = _elements(10_000_000)  # 20 MB of ten million numbers
# 3.4 MB: under the playground's ceiling, a parse bomb all the same. Empty lists are the costliest
# element found: 1.3 s to validate here (zeros 0.22 s, empty objects 0.29 s, empty strings 0.12 s).
WITHIN = _elements(1_133_000, b"[]")


async def _chunks(body: bytes) -> AsyncIterator[bytes]:  # no Content-Length: counted as it streams in
    for start in range(0, len(body), 1 << 20):
        yield body[start:start + (1 << 20)]


def _answered(env: Env, status: int) -> float:
    """How many POSTs the API answered ``status``, by its own count: a client still sending when
    the door refuses may see the connection closed instead of the answer."""
    metrics = httpx.get(env.api.url + "/metrics").text
    return sum(float(n) for n in re.findall(rf'sgw_api_requests_total{{method="POST",route="[^"]*",'
                                            rf'status="{status}"}} (\S+)', metrics))


@pytest.mark.parametrize("key", ["a", None])
def test_huge_bodies_four_at_once_are_refused_fast_while_the_api_answers(seeded_api: Env, key: str | None) -> None:
    url = f"{seeded_api.api.url}/v1/scorer-groups/{seeded_api.groups['a']}/grade"
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {seeded_api.keys[key]}"} if key else {})}
    expected = 413 if key else 401
    before = _answered(seeded_api, expected)

    async def attack() -> list[tuple[int, float]]:
        async with httpx.AsyncClient(timeout=60) as client:
            async def one(content: Any) -> tuple[int, float]:
                started = time.perf_counter()
                try:
                    status = (await client.post(url, content=content, headers=headers)).status_code
                except httpx.TransportError:  # refused and closed while the client was still sending
                    status = expected
                return status, time.perf_counter() - started
            bodies: list[Any] = [BIG, MANY, _chunks(BIG), _chunks(MANY)]
            return await asyncio.gather(*(one(body) for body in bodies))

    with LoopWatch(seeded_api) as watch:
        answers = asyncio.run(attack())
    assert [status for status, _ in answers] == [expected] * 4, answers
    assert _answered(seeded_api, expected) - before == 4, "the API itself refused all four"
    assert max(seconds for _, seconds in answers) < 5, answers
    assert watch.held(), watch
    assert _peak_rss_mb(seeded_api.api.proc.pid) < RSS_BOUND_MB  # type: ignore[union-attr]


def test_parse_bombs_under_the_ceiling_are_validated_off_the_event_loop(seeded_api: Env) -> None:
    # 1.1 million empty lists: over a second of validation each on the event loop; four at once.
    url = f"{seeded_api.api.url}/v1/scorer-groups/{seeded_api.groups['a']}/grade"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {seeded_api.keys['a']}"}

    async def attack() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(*(client.post(url, content=WITHIN, headers=headers) for _ in range(4)))

    with LoopWatch(seeded_api) as watch:
        answers = asyncio.run(attack())
    assert all(a.status_code == 400 and "at most 1048576" in a.text for a in answers), answers[0].text
    assert all(len(a.content) < 2000 for a in answers), "the refusal never echoes the body"
    assert watch.held() and watch.ticks >= 5, watch
    assert _peak_rss_mb(seeded_api.api.proc.pid) < RSS_BOUND_MB  # type: ignore[union-attr]


def test_no_body_is_read_before_the_key_is_checked(seeded_api: Env) -> None:
    # A slow-loris body that never arrives: the door answers 401 without waiting for it.
    with socket.create_connection(("127.0.0.1", seeded_api.api.port), timeout=5) as sock:
        sock.sendall(f"POST /v1/scorer-groups/{seeded_api.groups['a']}/grade HTTP/1.1\r\nHost: x\r\n"
                     "Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n{\"input\":".encode())
        started = time.perf_counter()
        head = sock.recv(4096).decode(errors="replace")
    assert head.startswith("HTTP/1.1 401") and time.perf_counter() - started < 2, head
    assert "www-authenticate: Bearer" in head.lower().replace("www-authenticate: bearer", "www-authenticate: Bearer")
    with seeded_api.client(None) as anonymous:
        assert anonymous.post("/v1/judges", json={"name": "J", "criteria": "?"},
                              headers={"Authorization": "Bearer sgw_nope_nope"}).status_code == 401


def _trickle(env: Env, path: str) -> socket.socket:
    """A valid key's large body that starts and then stops coming (no Content-Length)."""
    sock = socket.create_connection(("127.0.0.1", env.api.port), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {env.keys['a']}\r\n"
                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "d\r\n{\"outputs\": [\r\n".encode())
    return sock


def test_a_tenant_trickling_bodies_holds_its_share_of_the_reading_turns_not_everyones(seeded_api: Env) -> None:
    example = {"input": "q", "output": "a [[rating=7]]", "metadata": {"notes": "n" * 100_000}}

    def b_grades() -> float:  # B's large example (over 64 KiB: a reading turn, then a parser process)
        with seeded_api.client("b") as b:
            started = time.perf_counter()
            answer = b.post(f"/v1/scorer-groups/{seeded_api.groups['b']}/grade", json=example)
            assert answer.status_code == 200, answer.text
            return time.perf_counter() - started

    b_grades()  # the parser processes started (a spawn takes seconds on a busy machine): not measured
    alone = b_grades()
    stalled = [_trickle(seeded_api, "/v1/evaluations/x/finalize") for _ in range(6)]  # more than every turn
    try:
        time.sleep(0.5)
        # Waiting behind A's bodies would take until their read timeout (READ_TIMEOUT_S - 0.5 s).
        beside = b_grades()
        assert beside < alone + READ_TIMEOUT_S / 2, f"B took {beside:.2f} s beside A's bodies, {alone:.2f} s alone"
        heads = []
        for sock in stalled[:3]:  # the ones holding turns: ended by the read timeout, 408
            sock.settimeout(READ_TIMEOUT_S * 4)
            heads.append(sock.recv(4096).decode(errors="replace"))
        assert all(h.startswith("HTTP/1.1 408") for h in heads), heads
    finally:
        for sock in stalled:
            sock.close()


def test_every_route_with_a_body_declares_its_ceiling(seeded_api: Env) -> None:
    doc = httpx.get(seeded_api.api.url + "/openapi.json").json()
    ceilings = {(m.upper(), p): op["x-max-body-bytes"] for p, ops in doc["paths"].items()
                for m, op in ops.items() if "requestBody" in op}
    assert ceilings and all(isinstance(c, int) and c <= 64 * 1024 * 1024 for c in ceilings.values())
    assert ceilings[("POST", "/v1/scorer-groups/{id}/grade")] < 4 * 1024 * 1024
    assert ceilings[("POST", "/v1/judges")] == 512 * 1024
    with seeded_api.client("a") as a:  # a catalog document over its ceiling: refused unread
        assert a.post("/v1/judges", content=b" " * (600 * 1024),
                      headers={"Content-Type": "application/json"}).status_code == 413


# --- judge calls ---------------------------------------------------------------------------------


def test_a_project_saturating_the_judge_pool_leaves_another_its_share(seeded_api: Env) -> None:
    seeded_api.judge.set_default(Behaviour.deterministic(delay=JUDGE_DELAY_S))

    async def grade(who: str) -> tuple[int, float]:
        async with httpx.AsyncClient(base_url=seeded_api.api.url, timeout=120,
                                     headers={"Authorization": f"Bearer {seeded_api.keys[who]}"}) as client:
            started = time.perf_counter()
            answer = await client.post(f"/v1/scorer-groups/{seeded_api.groups[who]}/grade", json={"input": "q", "output": "a"})
            return answer.status_code, time.perf_counter() - started

    async def scene() -> tuple[list[tuple[int, float]], tuple[int, float], int]:
        # A: its allowed 4 gradings of a 20-judge group at once - 80 calls for 16 slots.
        a = [asyncio.ensure_future(grade("a")) for _ in range(4)]
        await asyncio.sleep(JUDGE_DELAY_S / 2)  # A holds every slot it may
        in_flight = seeded_api.judge.peak_in_flight
        b = await grade("b")  # B's one judge
        return await asyncio.gather(*a), b, in_flight

    try:
        a_answers, (b_status, b_seconds), a_in_flight = asyncio.run(scene())
    finally:
        seeded_api.judge.set_default(Behaviour.deterministic())
    assert b_status == 200 and b_seconds < JUDGE_DELAY_S + 1.0, f"B waited {b_seconds:.1f} s behind A"
    assert all(status == 200 for status, _ in a_answers)
    assert a_in_flight == 15, "A holds all but the slot kept back (16 - 16/16)"
    assert min(seconds for _, seconds in a_answers) > 2 * JUDGE_DELAY_S, "A's gradings did queue"


# --- budgets -------------------------------------------------------------------------------------


def test_a_project_key_cannot_lift_its_own_budget(seeded_api: Env) -> None:
    with seeded_api.client("a") as a, seeded_api.client("op") as op:
        assert a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 10**12}).status_code == 403, "no budget yet"
        assert op.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 100, "windowSeconds": 3600}).status_code == 200
        for attempt in ({"judgeCallsPerWindow": 10**12}, {"judgeCallsPerWindow": 101},
                        {"judgeCallsPerWindow": 10, "windowSeconds": 1},  # a shorter window: more calls a day
                        {"judgeCallsPerWindow": 100, "projectJudgeCallsPerWindow": 10**12}):
            answer = a.put("/v1/budgets/p-a", json=attempt)
            assert answer.status_code in (400, 403), (attempt, answer.text)
        assert a.delete("/v1/budgets/p-a").status_code == 403
        assert a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 10}).status_code == 200, "lowering is allowed"
        shown = a.get("/v1/budgets/p-a").json()
        assert (shown["judgeCallsPerWindow"], shown["projectJudgeCallsPerWindow"], shown["windowSeconds"]) == \
            (100, 10, 3600)
        assert a.put("/v1/budgets/p-a", json={"judgeCallsPerWindow": 100}).status_code == 200, \
            "back up to the operators' figure, never past it"
        assert op.delete("/v1/budgets/p-a").status_code == 204


# --- cursors and numbers -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["\u00b2", "\u2460", "\u0661\u0662", "\uff11\uff12", " 5", "1_0", "+5", "5.0",
                                   "9" * 20])  # past a signed 64-bit offset
def test_numbers_in_queries_are_ascii_digits_or_a_400(seeded_api: Env, value: str) -> None:
    group = seeded_api.groups["a"]
    with seeded_api.client("a") as a:
        for path, name in ((f"/v1/scorer-groups/{group}/changes", "cursor"),
                           (f"/v1/scorer-groups/{group}/results", "cursor"),
                           ("/v1/scorer-groups", "limit"), (f"/v1/judges/{group}/changes", "cursor")):
            answer = a.get(path, params={name: value})
            assert answer.status_code in (200, 400, 404), (path, answer.text)  # never a 500
            if answer.status_code == 400:
                assert name in answer.text
        assert a.get(f"/v1/scorer-groups/{group}/changes", params={"cursor": value}).status_code == 400
        incidents = a.get(f"/v1/scorer-groups/{group}/incidents", params={"cursor": value})
        assert incidents.status_code == 400 and "cursor" in incidents.text, incidents.text
        row = a.get(f"/v1/evaluations/run_0/rows/{value}/calls")  # a number in a path alike (all past 1,000,000)
        assert row.status_code == 400 and "row" in row.text, row.text
        results = a.get(f"/v1/scorer-groups/{group}/results", params={"cursor": value})
        if value.isascii() and value.isdigit():  # a place past the newest result: the end, as ever
            assert results.status_code == 200 and results.json() == {"items": [], "nextCursor": None}
        else:
            assert results.status_code == 400


# --- /docs ---------------------------------------------------------------------------------------


def test_no_page_of_the_apis_origin_loads_a_script_from_elsewhere(seeded_api: Env) -> None:
    console_csp = httpx.get(seeded_api.api.url + "/console").headers["content-security-policy"]
    for page in ("/docs", "/console"):
        answer = httpx.get(seeded_api.api.url + page)
        assert answer.status_code == 200 and answer.headers["content-security-policy"] == console_csp
        sources = re.findall(r"""<(?:script|link)[^>]+(?:src|href)=["']([^"']+)""", answer.text)
        assert sources and all(s.startswith("/") and not s.startswith("//") for s in sources), sources
        for source in sources:
            assert httpx.get(seeded_api.api.url + source).status_code == 200, source
    assert "script-src 'self'" in console_csp and "unsafe-inline" not in console_csp
    assert httpx.get(seeded_api.api.url + "/redoc").status_code == 404


def test_an_unreachable_store_is_a_503_at_the_door_not_a_500(tmp_path: Any) -> None:
    api = ApiProcess("redis://127.0.0.1:9/0", tmp_path / "api.log",  # the discard port: nothing listens
                     env={"SGW_REDIS_TIMEOUT_S": "1"}).start()
    try:
        answer = api.client("sgw_0123456789ab_well-formed").get("/v1/scorer-groups")
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1", answer.text
        assert answer.headers["content-type"] == "application/problem+json"
    finally:
        api.stop()
