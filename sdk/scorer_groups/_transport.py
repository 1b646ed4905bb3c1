# Generated from _transport_async.py by sdk/tools/generate_sync.py - do not edit; run `./dev sdk` to regenerate.
"""How the SDK's clients speak HTTP: one request per ``Call`` with the API key, retries as
``Retry`` says, and every page of a listing gathered. Written once, as ``AsyncTransport`` in
``_transport_async.py``; ``Transport`` in ``_transport.py`` is generated from it by
sdk/tools/generate_sync.py."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, TypeVar

import httpx

from scorer_groups import _calls as calls
from scorer_groups._calls import Call, Retry, raise_for_problem

T = TypeVar("T")


class Transport:
    def __init__(self, base_url: str, api_key: str, *, timeout_s: float, retry: Retry,
                 http: httpx.Client | None = None) -> None:
        self._http = http or httpx.Client(base_url=base_url, timeout=timeout_s)
        self._headers = {"Authorization": f"Bearer {api_key}", "User-Agent": "scorer-groups-sdk"}
        self._retry = retry

    def close(self) -> None:
        self._http.close()

    def send(self, call: Call[Any], params: Mapping[str, Any] | None = None) -> httpx.Response:
        attempt = 0
        while True:
            query = {**call.params, **(params or {})}
            headers = {**self._headers, **call.headers}
            response = self._http.request(call.method, call.path, params=query, json=call.json, headers=headers)
            delay = self._retry.delay(attempt, response)
            if delay is None:
                raise_for_problem(response)
                return response
            attempt += 1
            time.sleep(delay)

    def pause(self, seconds: float) -> None:
        """Sleep between polls (a backfill's ``wait``). Here, beside the retries' sleep: this is the
        one source that imports asyncio, which the generated client's ``time`` replaces."""
        time.sleep(seconds)

    def run(self, call: Call[T]) -> T:
        if call.item is None:
            return call.parse(self.send(call))
        items: list[Any] = []
        cursor: str | None = None
        while True:
            page_params = {"limit": calls.PAGE_SIZE, **({"cursor": cursor} if cursor else {})}
            page, cursor = call.page_items(self.send(call, page_params))
            items += page
            if cursor is None:
                return items  # type: ignore[return-value]
