"""A ceiling on request bodies: a tenant's request is read into memory whole (JSON), so without
one a single POST could take the API process's memory. Refused with 413, before or while the
body streams in: a declared ``Content-Length`` over the limit is refused unread, a chunked body
once it passes the limit."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from worker.api.problems import PROBLEM_JSON


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:  # SGW_API_MAX_BODY_BYTES
        self._app, self._max = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max:
            await self._refuse(scope, send)
            return
        seen, started, refused = 0, False, False

        async def counted() -> Message:
            # Past the limit: answer 413 here, and tell the app the client went away - whatever it
            # then makes of the body, its answer is dropped.
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self._max and not refused:
                    refused = True
                    if not started:
                        await self._refuse(scope, send)
                    return {"type": "http.disconnect"}
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if refused:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self._app(scope, counted, tracked)

    async def _refuse(self, scope: Scope, send: Send) -> None:
        body: dict[str, Any] = {"type": "about:blank", "title": "Content Too Large", "status": 413,
                                "detail": f"the request body is over {self._max} bytes",
                                "instance": scope.get("path"), "errors": []}
        payload = orjson.dumps(body)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", PROBLEM_JSON.encode()),
                                (b"content-length", str(len(payload)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})
