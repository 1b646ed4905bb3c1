"""External scorers over real HTTP, and the private-network guard."""

from __future__ import annotations

import dataclasses
import gzip
import re
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from adapters.egress import EgressPolicy, EgressRefused
from adapters.members.external import ExternalClient
from adapters.members.http import MAX_ANSWER_BYTES, RetryPolicy, no_cookies, post_capped
from scoring.blend import goodness
from scoring.models import CustomEvaluator
from scoring.ports import MemberError
from scoring.subjects import Subject
from tests.support.http_fakes import Reply, ScriptedServer

FAST_RETRY = RetryPolicy(attempts=3, backoff_base_s=0.01, backoff_cap_s=0.05)
SUBJECT = Subject(scope="trace", input="question", output="answer", expected=None,
                  spans=[{"spanId": "r"}], metadata={"k": "v"}, transcript="")


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as s:
        yield s


@pytest.fixture
async def client() -> AsyncIterator[ExternalClient]:
    c = ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]), policy=FAST_RETRY)
    yield c
    await c.close()


def scorer(url: str, **over: object) -> CustomEvaluator:
    return CustomEvaluator.model_validate({"id": "x", "name": "X", "type": "external", "url": url,
                                           "timeoutMs": 2000, **over})


async def test_score_is_posted_the_subject_and_read(server: ScriptedServer, client: ExternalClient) -> None:
    server.script(Reply(body={"score": 0.7}))
    assert await client.score(scorer(server.url + "/grade"), SUBJECT) == 0.7
    sent = server.requests[0]
    assert sent.path == "/grade"
    assert sent.json() == {"input": "question", "output": "answer", "expected": None,
                           "spans": [{"spanId": "r"}], "metadata": {"k": "v"}}


@pytest.mark.parametrize(("body", "invert", "expected_goodness"), [
    ({"verdict": True}, False, 1.0), ({"verdict": True}, True, 0.0),
    ({"passed": False}, False, 0.0), ({"passed": False}, True, 1.0)])
async def test_boolean_verdict_through_invert(server: ScriptedServer, client: ExternalClient,
                                              body: dict, invert: bool, expected_goodness: float) -> None:
    server.script(Reply(body=body))
    native = await client.score(scorer(server.url, invert=invert), SUBJECT)
    assert goodness("custom", native, invert=invert) == expected_goodness


async def test_500s_are_retried_then_reported(server: ScriptedServer, client: ExternalClient) -> None:
    server.script(*[Reply(status=500, body={"error": "boom"})] * 3)
    with pytest.raises(MemberError, match=r"HTTP 500: boom \(after 3 attempts\)"):
        await client.score(scorer(server.url), SUBJECT)
    assert len(server.requests) == 3


async def test_a_passing_500_is_retried_to_success(server: ScriptedServer, client: ExternalClient) -> None:
    server.script(Reply(status=503), Reply(body={"score": 0.25}))
    assert await client.score(scorer(server.url), SUBJECT) == 0.25


async def test_a_400_is_not_retried(server: ScriptedServer, client: ExternalClient) -> None:
    server.script(Reply(status=400, body={"detail": "bad input"}))
    with pytest.raises(MemberError, match="HTTP 400: bad input"):
        await client.score(scorer(server.url), SUBJECT)
    assert len(server.requests) == 1


async def test_answer_without_score_or_verdict(server: ScriptedServer, client: ExternalClient) -> None:
    server.script(Reply(body={"result": "great"}))
    with pytest.raises(MemberError, match="neither"):
        await client.score(scorer(server.url), SUBJECT)


async def test_score_out_of_range_is_returned_native_and_refused_by_goodness(
        server: ScriptedServer, client: ExternalClient) -> None:
    server.script(Reply(body={"score": 1.5}))
    native = await client.score(scorer(server.url), SUBJECT)
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        goodness("custom", native)


async def test_timeout(server: ScriptedServer) -> None:
    server.script(*[Reply(delay_s=1.0)] * 3)
    c = ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]), policy=RetryPolicy(attempts=1))
    try:
        # The reason names the limit that fired (the HTTP client's, set to the scorer's timeout).
        with pytest.raises(MemberError, match=r"^external scorer timed out after (\d+) ms \(after 1 attempt\)$") \
                as error:
            await c.score(scorer(server.url, timeoutMs=200), SUBJECT)
        # what was left of the 200 ms once the request was sent (the egress check comes first)
        assert 100 <= int(re.findall(r"\d+", str(error.value))[0]) <= 200
    finally:
        await c.close()


@pytest.mark.parametrize("url", ["http://127.0.0.1:9/x", "http://10.1.2.3/x", "http://192.168.0.10/x",
                                 "http://169.254.169.254/latest/meta-data", "http://[::1]:8080/",
                                 "http://localhost:9/x", "http://[::ffff:10.0.0.1]/", "http://100.64.1.1/"])
async def test_private_urls_are_refused_without_traffic(url: str) -> None:
    c = ExternalClient(EgressPolicy.parse([]), policy=FAST_RETRY)
    try:
        with pytest.raises(MemberError, match="URL refused"):
            await c.score(scorer(url), SUBJECT)
    finally:
        await c.close()


async def test_allow_list_by_network_and_by_host() -> None:
    await EgressPolicy.parse(["10.0.0.0/8"]).check("http://10.1.2.3/x")
    await EgressPolicy.parse(["localhost"]).check("http://localhost:8080/x")
    with pytest.raises(EgressRefused):
        await EgressPolicy.parse(["10.0.0.0/8"]).check("http://192.168.1.1/x")


async def test_public_address_passes_the_guard() -> None:
    # Checked only: nothing connects to it (the tests reach loopback alone).
    target = await EgressPolicy.parse([]).check("https://93.184.216.34:8443/score?x=1")
    assert target.url == "https://93.184.216.34:8443/score?x=1", "an address is called as given"
    assert target.headers == {} and target.extensions == {}, "no name to keep in Host or SNI"


async def test_a_checked_name_is_pinned_to_the_address_that_passed() -> None:
    import ipaddress
    import socket
    from urllib.parse import urlsplit

    policy = EgressPolicy.parse(["127.0.0.0/8", "::1/128"])
    resolved = {info[4][0] for info in socket.getaddrinfo("localhost", 8443, type=socket.SOCK_STREAM)}
    target = await policy.check("https://localhost:8443/score?x=1")
    parts = urlsplit(target.url)
    assert parts.hostname is not None and str(ipaddress.ip_address(parts.hostname)) in resolved
    assert (parts.port, parts.path, parts.query) == (8443, "/score", "x=1")
    assert target.headers == {"Host": "localhost:8443"}, "the server still sees the name"
    assert target.extensions == {"sni_hostname": "localhost"}, "TLS still checks the name"
    plain = await policy.check("http://localhost/hook")
    assert "sni_hostname" not in plain.extensions and plain.headers == {"Host": "localhost"}


async def test_literal_addresses_and_trusted_names_are_not_rewritten() -> None:
    assert (await EgressPolicy.parse(["127.0.0.0/8"]).check("http://127.0.0.1:9/x")).url == "http://127.0.0.1:9/x"
    trusted = await EgressPolicy.parse(["scorer.internal"]).check("http://scorer.internal/x")
    assert trusted.url == "http://scorer.internal/x" and trusted.headers == {}


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
async def test_a_cookie_one_tenants_scorer_sets_is_never_sent_for_another(host: str) -> None:
    # Two projects' scorers on one service (a shared SaaS): the cookie its answer to one project
    # sets (a session, an account) must not ride along with the other's call - nor with the
    # same project's next one (each call stands alone). By name and by address alike.
    c = ExternalClient(EgressPolicy.parse(["127.0.0.0/8", "localhost"]), policy=FAST_RETRY)
    try:
        with ScriptedServer(Reply(body={"score": 0.5}, headers={"Set-Cookie": "session=tenant-a; Path=/"})) as s:
            url = s.url.replace("127.0.0.1", host)
            await c.score(scorer(url), dataclasses.replace(SUBJECT, project_id="tenant-a"))
            await c.score(scorer(url), dataclasses.replace(SUBJECT, project_id="tenant-b"))
            assert len(s.requests) == 2 and "cookie" not in s.requests[1].headers
    finally:
        await c.close()


@pytest.mark.parametrize(("answer", "error"), [
    (Reply(body=b'{"score": 0.5, "pad": "' + b"x" * (8 << 20) + b'"}'), "answered more than 1 MiB"),  # as it is
    (Reply(body=gzip.compress(b'{"score": 0.5, "pad": "' + b"x" * (64 << 20) + b'"}'),  # 64 MiB in ~64 KiB
           headers={"Content-Encoding": "gzip"}), "answer is not JSON"),  # read as sent: never inflated
], ids=["huge", "gzip-bomb"])
async def test_a_scorer_answering_more_than_a_score_is_read_no_further_and_fails(answer: Reply, error: str) -> None:
    # A tenant's service is hostile: what it answers is read up to MAX_ANSWER_BYTES as sent,
    # never inflated, then the call fails as the member's error - the worker's memory is every
    # tenant's.
    c = ExternalClient(EgressPolicy.parse(["127.0.0.0/8"]), policy=FAST_RETRY)
    try:
        with ScriptedServer(answer) as s:
            with pytest.raises(MemberError, match=error):
                await c.score(scorer(s.url), SUBJECT)
            assert s.requests[0].headers.get("accept-encoding") == "identity"
    finally:
        await c.close()


async def test_a_webhook_receivers_huge_answer_is_cut_and_its_status_still_read() -> None:
    # A receiver's answer is read for its status and an error's first words: past the cap it is
    # cut, not refused (consumers/webhooks.py reads it with cut=True).
    async with httpx.AsyncClient(cookies=no_cookies()) as http:
        with ScriptedServer(Reply(status=503, body=b"x" * (8 << 20))) as s:
            answer = await post_capped(http, s.url, content=b"{}", headers={}, extensions=None, io_timeout_s=5,
                                       what="the receiver", cut=True)
    assert answer.status == 503 and len(answer.body) == MAX_ANSWER_BYTES
