"""Riding out an outage of Redis or the broker inside the process, instead of exiting: every loop's one outage rule.

``outage_of``: the dependency an error says is away - wait for it (``OutageGuard.call``), losing nothing;
``not_the_subjects_fault``: what the infrastructure raised - stop without committing. The one rule: a
step retried here must be safe to repeat, and an error that is not an outage is raised at once.
More: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import structlog
from aiokafka.errors import KafkaError, KafkaTimeoutError
from redis.exceptions import (
    BusyLoadingError,
    ClusterDownError,
    ReadOnlyError,
    RedisError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from adapters.stores.client import PoolBusy
from consumers.events import SILENT
from scoring.backoff import exponential
from scoring.errors import ScoringError

log = structlog.get_logger(__name__)

T = TypeVar("T")

_FIRST_DELAY_S = 0.1
_MAX_DELAY_S = 5.0


def outage_of(exc: BaseException) -> str | None:
    """Which dependency ``exc`` says is unreachable for now ("redis", "kafka"), or None."""
    if isinstance(exc, PoolBusy):  # the process's own pool, full: back-pressure (``OutageGuard.call``)
        return None
    if isinstance(exc, RedisConnectionError | RedisTimeoutError | BusyLoadingError | ReadOnlyError):
        return "redis"
    # A Redis Cluster failing over or moving slots answers CLUSTERDOWN, MASTERDOWN or TRYAGAIN,
    # or leaves a slot uncovered for a moment: each passes once the cluster settles.
    if isinstance(exc, ClusterDownError | TryAgainError | SlotNotCoveredError):
        return "redis"
    if isinstance(exc, KafkaTimeoutError) or (isinstance(exc, KafkaError) and getattr(exc, "retriable", False)):
        return "kafka"
    if isinstance(exc, ConnectionError | TimeoutError):  # a socket-level failure under either client
        return "network"
    if isinstance(exc, AttributeError | TypeError | RuntimeError) and _raised_in_redis_connection(exc):
        # redis-py's asyncio client lets a connection closed under a write surface as these
        # (its writer or transport already torn down: redis/redis-py#4287, #3546; uvloop's closed
        # transport: "the handler is closed"), seen here when a Redis Cluster primary fails over:
        # a broken connection, which is an outage like any.
        return "redis"
    return None


def _raised_in_redis_connection(exc: BaseException) -> bool:
    """Raised while redis-py wrote to or read from a connection: it passed through its
    connection module, and was raised there or in the event loop's transport under it (asyncio's
    or uvloop's; not in our code)."""
    files = []
    tb = exc.__traceback__
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename.replace("\\", "/"))
        tb = tb.tb_next
    through = any("/redis/" in f and f.endswith("/connection.py") for f in files)
    return through and bool(files) and any(part in files[-1] for part in ("/redis/", "/asyncio/", "uvloop/"))


class OutageTooLong(ScoringError):
    """A dependency stayed unreachable past the tolerance: the process should exit (and be
    restarted by its orchestrator), leaving uncommitted work to be redelivered."""


def not_the_subjects_fault(exc: BaseException) -> bool:
    """Whether ``exc`` came from the infrastructure rather than from the trace or conversation
    being scored: a loop stops for it (uncommitted work is redelivered) instead of blaming the subject."""
    return isinstance(exc, RedisError | KafkaError | OutageTooLong) or outage_of(exc) is not None


class OutageEvents(Protocol):
    def outage(self, dependency: str, unreachable: bool) -> None: ...


DEFAULT_TOLERANCE_S = 120.0  # SGW_OUTAGE_TOLERANCE_S's default: a loop built without a guard rides out this long


class OutageGuard:
    def __init__(self, tolerance_s: float = DEFAULT_TOLERANCE_S, events: OutageEvents | None = None) -> None:
        self.tolerance_s = tolerance_s
        self._events: OutageEvents = events or SILENT
        self._failing: dict[str, int] = {}  # dependency -> steps now waiting for it
        self._since: dict[str, float] = {}  # dependency -> when it was first seen unreachable
        self._reason: dict[str, str] = {}

    @property
    def reason(self) -> str | None:
        """None while every dependency answers; else what is unreachable, since when, and why."""
        if not self._failing:
            return None
        now = time.monotonic()
        return "; ".join(f"{dep} unreachable for {now - self._since[dep]:.0f}s ({self._reason[dep]})"
                         for dep in sorted(self._failing))

    async def call(self, step: Callable[[], Awaitable[T]]) -> T:
        """Run ``step``; while it fails with an outage, retry with backoff up to the tolerance."""
        retries = 0
        waiting_for: str | None = None
        first_failed = 0.0
        try:
            while True:
                try:
                    return await step()
                except Exception as exc:
                    # The pool full past its wait is the process's own back-pressure, not Redis
                    # down: retried like an outage, never reported as one.
                    dependency = "redis pool" if isinstance(exc, PoolBusy) else outage_of(exc)
                    if dependency is None:
                        raise
                    if not first_failed:
                        first_failed = time.monotonic()
                    if waiting_for is None and not isinstance(exc, PoolBusy):
                        waiting_for = dependency
                        self._enter(dependency, exc)
                    # The tolerance counts from this step's own first failure: the guard is shared
                    # by every loop, and one loop's long wait must not end another's first retry.
                    lasted = time.monotonic() - first_failed
                    if lasted > self.tolerance_s:
                        raise OutageTooLong(f"{dependency} unreachable for {lasted:.0f}s, past the tolerance of "
                                            f"{self.tolerance_s:g}s: {exc!r}") from exc
                await asyncio.sleep(exponential(retries, _FIRST_DELAY_S, _MAX_DELAY_S, floor=0.5))
                retries += 1
        finally:
            if waiting_for is not None:
                self._leave(waiting_for)

    def _enter(self, dependency: str, exc: BaseException) -> None:
        self._failing[dependency] = self._failing.get(dependency, 0) + 1
        self._reason[dependency] = type(exc).__name__
        if self._failing[dependency] == 1:
            self._since.setdefault(dependency, time.monotonic())
            log.warning("dependency unreachable; waiting for it", dependency=dependency, error=repr(exc)[:300],
                        tolerance_s=self.tolerance_s)
            self._events.outage(dependency, True)

    def _leave(self, dependency: str) -> None:
        left = self._failing.get(dependency, 1) - 1
        if left > 0:
            self._failing[dependency] = left
            return
        self._failing.pop(dependency, None)
        since = self._since.pop(dependency, time.monotonic())
        log.info("dependency reachable again", dependency=dependency, after_s=round(time.monotonic() - since, 1))
        self._events.outage(dependency, False)
