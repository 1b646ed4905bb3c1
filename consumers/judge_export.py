"""Judge calls exported as OpenTelemetry spans over OTLP/HTTP (``SGW_JUDGE_TRACE_EXPORT=otlp``).

The one rule: telemetry, not a result - it must never hold up scoring nor grow without bound (a bounded
queue whose oldest spans are dropped and counted). Take, send, outcome, stop: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Protocol

import httpx
import structlog

from scoring.otlp.judge_spans import CallSpan, export_request

log = structlog.get_logger(__name__)

RETRY_PAUSE_S = 1.0
LOG_EVERY_S = 60.0


class JudgeCallSink(Protocol):
    """Where the outputs hand over the judge calls of what they published."""

    def add(self, spans: Iterable[CallSpan]) -> None: ...


class JudgeExportEvents(Protocol):
    def judge_spans(self, outcome: str, count: int) -> None: ...  # sent | dropped | failed


class JudgeCallExporter:
    def __init__(self, endpoint: str, *, headers: Mapping[str, str] | None = None, service_version: str = "",
                 max_queued: int = 10_000, max_queued_chars: int = 8_000_000, batch: int = 64,
                 interval_s: float = 1.0, timeout_s: float = 10.0, events: JudgeExportEvents | None = None) -> None:
        self._endpoint = endpoint
        self._version = service_version
        self._queue: deque[tuple[CallSpan, int]] = deque()  # (span, its characters)
        self._queued_chars = 0
        self._closed = False
        self._max_queued, self._max_chars = max_queued, max_queued_chars
        self._batch, self._interval_s = batch, interval_s
        self._events = events
        self._full = asyncio.Event()
        self._http = httpx.AsyncClient(timeout=timeout_s, headers={
            **(headers or {}), "Content-Type": "application/x-protobuf", "User-Agent": "scorer-group-worker"})
        self._last_log = 0.0
        self.sent = self.dropped = self.failed = 0  # for tests and logs

    # 1. Take
    def add(self, spans: Iterable[CallSpan]) -> None:
        for span in spans:
            if self._closed:  # 4. after the stop: nothing will send it
                self._count("dropped", 1)
                continue
            size = len(span.call.answer or "") + sum(len(content) for _, content in span.call.messages)
            self._queue.append((span, size))
            self._queued_chars += size
            while len(self._queue) > self._max_queued or self._queued_chars > self._max_chars:
                self._queued_chars -= self._queue.popleft()[1]
                self._count("dropped", 1)
        if len(self._queue) >= self._batch:
            self._full.set()

    # 2-3. Send
    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._full.wait(), self._interval_s)
                self._full.clear()
                await self.flush()
            await self.flush()  # 4. what was queued, within the caller's deadline for background loops
        finally:
            self._closed = True
            if self._queue:  # cancelled at the deadline: what is left is lost, and said so
                self._count("dropped", len(self._queue))
                self._queue.clear()
                self._queued_chars = 0
            await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def probe(self) -> str | None:
        """One export of no spans, as ``scorer-worker check`` tries the endpoint: None when it is
        taken, else what went wrong. Not retried, not counted."""
        empty = export_request([], self._version).SerializeToString()
        try:
            answer = await self._http.post(self._endpoint, content=empty)
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            return f"unreachable ({type(exc).__name__})"
        return None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"

    async def flush(self) -> None:
        while self._queue:
            batch = []
            for _ in range(min(self._batch, len(self._queue))):
                span, size = self._queue.popleft()
                self._queued_chars -= size
                batch.append(span)
            await self._send(batch)
            await asyncio.sleep(0)  # building the next batch waits for the traces' turn

    async def _send(self, batch: list[CallSpan]) -> None:
        body = export_request(batch, self._version).SerializeToString()
        for attempt in (1, 2):
            try:
                answer = await self._http.post(self._endpoint, content=body)
            except httpx.HTTPError as exc:
                problem = f"unreachable ({type(exc).__name__})"
            else:
                if 200 <= answer.status_code < 300:
                    self._count("sent", len(batch))
                    return
                problem = f"HTTP {answer.status_code}"
                if answer.status_code != 429 and answer.status_code < 500:
                    break
            if attempt == 1:
                await asyncio.sleep(RETRY_PAUSE_S)
        self._count("failed", len(batch))
        now = time.monotonic()
        if now - self._last_log >= LOG_EVERY_S:
            self._last_log = now
            log.warning("judge spans could not be exported; dropped", spans=len(batch), problem=problem,
                        failed_so_far=self.failed)

    def _count(self, outcome: str, count: int) -> None:
        setattr(self, outcome, getattr(self, outcome) + count)
        if self._events is not None:
            self._events.judge_spans(outcome, count)
