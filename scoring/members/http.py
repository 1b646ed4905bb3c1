"""HTTP calls of member scorers (judges, external scorers): retries with backoff, and errors
that say whether trying again could help.

Scoring a subject is idempotent, so a call is retried on what is likely passing: 429 and 5xx
answers and transport failures. A ``Retry-After`` header is honoured. Every retry must fit in
the caller's deadline; a wait that would not fit ends the call with the last error instead.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class MemberError(Exception):
    """A member produced no verdict. ``str(exc)`` is the reason shown on the result."""

    def __init__(self, reason: str, *, retriable: bool = False) -> None:
        super().__init__(reason)
        self.retriable = retriable


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    attempts: int = 3
    backoff_base_s: float = 0.25
    backoff_cap_s: float = 8.0
    retry_after_cap_s: float = 30.0

    def backoff(self, attempt: int) -> float:
        """Full jitter: spreads retries of many workers that failed at the same moment."""
        return random.uniform(0, min(self.backoff_cap_s, self.backoff_base_s * 2 ** attempt))


DEFAULT_RETRY = RetryPolicy()


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds: either a number of seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def describe_status(response: httpx.Response) -> str:
    """'HTTP 503' plus the server's own short message when it sent one (OpenAI-style or plain)."""
    detail = ""
    try:
        body = response.json()
        if isinstance(body, dict):
            error = body.get("error")
            message = error.get("message") if isinstance(error, dict) else error
            detail = str(message or body.get("detail") or "")
    except ValueError:
        detail = response.text[:120]
    return f"HTTP {response.status_code}" + (f": {detail[:160]}" if detail else "")


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any] | bytes,
    *,
    what: str,
    deadline: float,
    headers: dict[str, str] | None = None,
    extensions: dict[str, Any] | None = None,
    policy: RetryPolicy = DEFAULT_RETRY,
) -> httpx.Response:
    """POST ``body`` (a JSON document, or JSON bytes sent as they are) until a non-retriable
    answer, the attempts run out or the deadline (a ``loop.time()`` value) would pass. Returns
    the 2xx response; raises MemberError."""
    loop = asyncio.get_running_loop()
    last_error = f"{what} was not called"
    attempt = 0
    for attempt in range(policy.attempts):
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        wait: float | None = None
        try:
            if isinstance(body, bytes):  # exact bytes, e.g. a signed webhook body
                response = await client.post(url, content=body, timeout=remaining, extensions=extensions,
                                             headers={"Content-Type": "application/json", **(headers or {})})
            else:
                response = await client.post(url, json=body, headers=headers, timeout=remaining,
                                             extensions=extensions)
        except httpx.TimeoutException:
            last_error = f"{what} timed out"
        except httpx.TransportError as exc:
            last_error = f"{what} unreachable ({type(exc).__name__})"
        else:
            if response.is_success:
                return response
            last_error = f"{what} answered {describe_status(response)}"
            if response.status_code not in RETRY_STATUSES:
                raise MemberError(last_error, retriable=False)
            wait = retry_after_seconds(response.headers.get("retry-after"))
            if wait is not None:
                wait = min(wait, policy.retry_after_cap_s)
        if attempt == policy.attempts - 1:
            break
        wait = policy.backoff(attempt) if wait is None else wait
        if loop.time() + wait >= deadline:
            last_error += f"; retry in {wait:.1f}s would pass the deadline"
            break
        await asyncio.sleep(wait)
    raise MemberError(f"{last_error} (after {attempt + 1} attempt{'s' if attempt else ''})",
                      retriable=True)
