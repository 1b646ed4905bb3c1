"""The door every HTTP request passes before any of its body is read.

The one rule: nothing is read before the caller is known and the body bounded - the route's ceiling
(declared in the OpenAPI document), the key checked (401; a reviewer key 403 wherever a route does not
open to reviewers: deny by default), a body over the ceiling refused (413). Parsing is
``worker.api.bodies``. The steps: docs/design-notes.md.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from redis.exceptions import RedisClusterException, RedisError
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from adapters.stores.apikeys import ApiKey, ApiKeyStore
from worker.api.problems import PROBLEM_JSON, TITLES

SMALL_BODY = 512 * 1024  # any catalog document: a code scorer's 100,000 characters, escaped, fit
CEILING_KEY = "x-max-body-bytes"
REVIEWERS_KEY = "x-reviewers"
CHALLENGE = (b"www-authenticate", b"Bearer")


def ceiling(max_bytes: int) -> dict[str, Any]:
    """A route's own body ceiling, declared in its OpenAPI entry (``openapi_extra``)."""
    return {CEILING_KEY: max_bytes}


def for_reviewers() -> dict[str, Any]:
    """A route a reviewer key may call (``openapi_extra``)."""
    return {REVIEWERS_KEY: True}


class Door:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:  # SGW_API_MAX_BODY_BYTES
        self._app, self._max = app, max_bytes
        self._ceilings: list[tuple[re.Pattern[str], str, int]] | None = None
        self._reviewer_routes: list[tuple[re.Pattern[str], str]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        # 1. the route's ceiling
        limit = min(self._max, self._ceiling(scope))
        headers = dict(scope.get("headers") or [])
        # 2. the key, before the body
        if scope["path"] == "/v1" or scope["path"].startswith("/v1/"):
            try:
                key, refusal = await self._key(scope, headers.get(b"authorization"))
            except (RedisError, RedisClusterException):  # keys live in Redis: unknown for now, not wrong - a 503
                await _answer(scope, send, 503, "the API cannot reach its store to check the key; retry shortly",
                              [(b"retry-after", b"1")])
                return
            if key is None:
                await _answer(scope, send, 401, refusal, [CHALLENGE])
                return
            if key.role == "reviewer" and not self._open_to_reviewers(scope):
                await _answer(scope, send, 403, "a reviewer key may only list its project's review queues, take "
                                                "their next item and label it", [])
                return
            scope.setdefault("state", {})["api_key"] = key
        # 3. the body's size, declared or counted
        declared = headers.get(b"content-length")
        if declared is not None and not (declared.isascii() and declared.isdigit() and int(declared) <= limit):
            await _too_large(scope, send, limit)
            return
        counted = _Counted(scope, receive, send, limit)
        await self._app(scope, counted.receive, counted.send)

    def _ceiling(self, scope: Scope) -> int:
        if self._ceilings is None:  # from the OpenAPI document: the one place routes declare them
            doc = scope["app"].openapi()
            self._ceilings = [(compile_path(path)[0], method.upper(), int(operation[CEILING_KEY]))
                              for path, operations in doc.get("paths", {}).items()
                              for method, operation in operations.items() if CEILING_KEY in operation]
        for pattern, method, limit in self._ceilings:
            if method == scope["method"] and pattern.match(scope["path"]):
                return limit
        return SMALL_BODY

    def _open_to_reviewers(self, scope: Scope) -> bool:
        if self._reviewer_routes is None:
            doc = scope["app"].openapi()
            self._reviewer_routes = [(compile_path(path)[0], method.upper())
                                     for path, operations in doc.get("paths", {}).items()
                                     for method, operation in operations.items() if operation.get(REVIEWERS_KEY)]
        return any(method == scope["method"] and pattern.match(scope["path"])
                   for pattern, method in self._reviewer_routes)

    async def _key(self, scope: Scope, header: bytes | None) -> tuple[ApiKey | None, str]:
        scheme, _, token = (header or b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None, "send an API key as 'Authorization: Bearer <key>'"
        key = await ApiKeyStore(scope["app"].state.redis).authenticate(token.strip())
        return key, "the API key is unknown or revoked"


class _Counted:
    """The body as it streams in, counted: past the ceiling the client is answered 413 here (if
    the app has not begun its answer), and the app is told the client went away - whatever it
    makes of the body, its answer is dropped."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        self._scope, self._receive, self._send, self._limit = scope, receive, send, limit
        self._seen, self._refused, self._answering = 0, False, False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self._seen += len(message.get("body", b""))
            if self._seen > self._limit:
                if not self._refused and not self._answering:
                    await _too_large(self._scope, self._send, self._limit)
                self._refused = True
                return {"type": "http.disconnect"}
        return message

    async def send(self, message: Message) -> None:
        if self._refused:
            return
        self._answering = self._answering or message["type"] == "http.response.start"
        await self._send(message)


async def _too_large(scope: Scope, send: Send, limit: int) -> None:
    await _answer(scope, send, 413, f"the request body is over {limit} bytes, this route's ceiling", [])


async def _answer(scope: Scope, send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]]) -> None:
    body: dict[str, Any] = {"type": "about:blank", "title": TITLES.get(status, "Error"),
                            "status": status, "detail": detail, "instance": scope.get("path"), "errors": []}
    payload = orjson.dumps(body)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", PROBLEM_JSON.encode()), (b"content-length", str(len(payload)).encode()),
                            (b"connection", b"close"), *headers]})
    await send({"type": "http.response.body", "body": payload})
