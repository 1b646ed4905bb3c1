"""HTTP calls of member scorers (judges, external scorers): retries with backoff, and errors
that say whether trying again could help.

Scoring a subject is idempotent, so a call is retried on what is likely passing: 429 and 5xx
answers and transport failures. A ``Retry-After`` header is honoured. Every retry must fit in
the caller's deadline; a wait that would not fit ends the call with the last error instead.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import orjson

from scoring.backoff import exponential, retry_after_seconds
from scoring.ports import MemberError, RetryGate

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


def no_cookies() -> http.cookiejar.CookieJar:
    """A cookie jar that keeps none, for every client that calls tenants' URLs: one client serves
    every project, so a cookie one answer sets (a session, an account) would ride along with
    another project's call to the same host. Each call stands alone."""
    return http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3
    backoff_base_s: float = 0.25
    backoff_cap_s: float = 8.0
    retry_after_cap_s: float = 30.0

    def backoff(self, attempt: int) -> float:
        return exponential(attempt, self.backoff_base_s, self.backoff_cap_s)


DEFAULT_RETRY = RetryPolicy()


@dataclass(frozen=True, slots=True)
class Answer:
    """An HTTP answer, whichever client fetched it."""

    status: int
    headers: Mapping[str, str]  # the client's own case-insensitive mapping
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON; raises ValueError when it is not."""
        return orjson.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def json_bytes(body: Any) -> bytes:
    """``body`` as JSON; what orjson refuses (an integer past 64 bits) by the standard encoder."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return json.dumps(body, separators=(",", ":")).encode()


class Unreachable(Exception):
    """The call got no answer (timeout, connection refused or reset): worth trying again."""


def describe_status(status: int, body: bytes) -> str:
    """'HTTP 503' plus the server's own short message when it sent one (OpenAI-style or plain)."""
    detail = ""
    try:
        document = orjson.loads(body)
        if isinstance(document, dict):
            error = document.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            detail = str(message or document.get("detail") or "")
    except ValueError:
        detail = body[:120].decode("utf-8", errors="replace")
    return f"HTTP {status}" + (f": {detail[:160]}" if detail else "")


async def with_retries(send: Callable[[float], Awaitable[Answer]], *, what: str, deadline: float,
                       policy: RetryPolicy = DEFAULT_RETRY, before_retry: RetryGate | None = None) -> Answer:
    """Call ``send(seconds left)`` until a non-retriable answer, the attempts run out or the
    deadline (a ``loop.time()`` value) would pass. Returns the 2xx answer; raises MemberError.
    ``before_retry`` is asked before each retry (a judge's: one more budget slot); False ends the
    call there, not retriable."""
    loop = asyncio.get_running_loop()
    last_error = f"{what} was not called"
    attempt = 0
    for attempt in range(policy.attempts):
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        wait: float | None = None
        try:
            answer = await send(remaining)
        except Unreachable as exc:
            last_error = f"{what} {exc}"
        else:
            if answer.ok:
                return answer
            last_error = f"{what} answered {describe_status(answer.status, answer.body)}"
            if answer.status not in RETRY_STATUSES:
                raise MemberError(last_error, retriable=False)
            wait = retry_after_seconds(answer.headers.get("retry-after"))
            if wait is not None:
                wait = min(wait, policy.retry_after_cap_s)
        if attempt == policy.attempts - 1:
            break
        wait = policy.backoff(attempt) if wait is None else wait
        if loop.time() + wait >= deadline:
            last_error += f"; retry in {wait:.1f}s would pass the deadline"
            break
        await asyncio.sleep(wait)
        if before_retry is not None and not await before_retry():
            raise MemberError(f"{last_error}; budget exhausted before retry (after {attempt + 1} "
                              f"attempt{'s' if attempt else ''})", retriable=False)
    raise MemberError(f"{last_error} (after {attempt + 1} attempt{'s' if attempt else ''})",
                      retriable=True)


# Of a tenant's service's answer, read as it is sent (a score, or an error's first words): the
# worker's memory is every tenant's. Asked uncompressed and never inflated here - a few KiB of
# gzip can inflate to gigabytes.
MAX_ANSWER_BYTES = 1 << 20


class AnswerTooLarge(MemberError):
    def __init__(self, what: str) -> None:
        super().__init__(f"{what} answered more than {MAX_ANSWER_BYTES >> 20} MiB; read no further",
                         retriable=False)


async def post_capped(client: httpx.AsyncClient, url: str, *, content: bytes, headers: Mapping[str, str],
                      extensions: dict[str, Any] | None, io_timeout_s: float, what: str,
                      cut: bool = False) -> Answer:
    """POST to a tenant's URL and read at most ``MAX_ANSWER_BYTES`` of the answer, as sent
    (``Accept-Encoding: identity``; a body compressed anyway is read compressed, which no caller
    parses). Past the cap: ``AnswerTooLarge``, or with ``cut`` the body's start (a webhook
    receiver's answer is read for its status and an error's first words only)."""
    sent = {**headers, "Accept-Encoding": "identity"}
    async with client.stream("POST", url, content=content, headers=sent, extensions=extensions,
                             timeout=io_timeout_s) as response:
        body = bytearray()
        async for chunk in response.aiter_raw():
            body += chunk
            if len(body) > MAX_ANSWER_BYTES:
                if not cut:
                    raise AnswerTooLarge(what)
                del body[MAX_ANSWER_BYTES:]
                break
        return Answer(response.status_code, response.headers, bytes(body))


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    *,
    what: str,
    deadline: float,
    headers: dict[str, str] | None = None,
    extensions: dict[str, Any] | None = None,
    policy: RetryPolicy = DEFAULT_RETRY,
    before_retry: RetryGate | None = None,
) -> Answer:
    """POST ``body`` as JSON with httpx (external scorers: the egress guard's pinned address and
    TLS name travel in ``extensions``), with ``with_retries``."""
    content = json_bytes(body)
    sent_headers = {"Content-Type": "application/json", **(headers or {})}

    async def send(remaining: float) -> Answer:
        try:
            return await post_capped(client, url, content=content, headers=sent_headers, extensions=extensions,
                                     io_timeout_s=remaining, what=what)
        except httpx.TimeoutException:
            raise Unreachable(f"timed out after {round(remaining * 1000)} ms") from None
        except httpx.TransportError as exc:
            raise Unreachable(f"unreachable ({type(exc).__name__})") from None

    return await with_retries(send, what=what, deadline=deadline, policy=policy, before_retry=before_retry)


async def post_json_aiohttp(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    *,
    what: str,
    deadline: float,
    headers: dict[str, str] | None = None,
    policy: RetryPolicy = DEFAULT_RETRY,
    before_retry: RetryGate | None = None,
    sent: Callable[[], None] | None = None,
) -> Answer:
    """POST ``body`` as JSON with aiohttp (judges: an operator's endpoint, many calls at once -
    a quarter of httpx's CPU per call, measured), with ``with_retries``; ``sent`` is told of
    each request sent."""
    content = json_bytes(body)
    sent_headers = {"Content-Type": "application/json", **(headers or {})}

    async def send(remaining: float) -> Answer:
        if sent is not None:
            sent()
        try:
            async with session.post(url, data=content, headers=sent_headers,
                                    timeout=aiohttp.ClientTimeout(total=remaining)) as response:
                return Answer(response.status, response.headers, await response.read())
        except TimeoutError:
            raise Unreachable(f"timed out after {round(remaining * 1000)} ms") from None
        except aiohttp.ClientError as exc:
            raise Unreachable(f"unreachable ({type(exc).__name__})") from None

    return await with_retries(send, what=what, deadline=deadline, policy=policy, before_retry=before_retry)
