"""What the loops report about their work, and the one null object for every such report.

Each loop declares what it reports as a protocol (``PipelineEvents`` here, ``OtlpEvents``,
``WebhookEvents``, ``consumers.loop.LoopEvents``, ``consumers.outage.OutageEvents``); the worker
passes Prometheus implementations (``worker.metrics``), and a loop given none reports to
``SILENT``. Keeping these protocols keeps ``consumers`` free of any metrics library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol


class PipelineEvents(Protocol):
    def consumed(self, count: int) -> None: ...
    def dead_lettered(self, reason: str) -> None: ...
    def kept(self, project: str, group: str, count: int = 1) -> None: ...
    def filtered(self, project: str, group: str, count: int = 1) -> None: ...
    def group_scored(self, project: str, group: str, scope: str, rating: float | None) -> None: ...
    def group_skipped(self, project: str, group: str, why: str, count: int = 1) -> None: ...
    def regex_text_cut(self, project: str, count: int) -> None: ...
    def signal_raised(self, project: str, group: str, severity: str) -> None: ...
    def in_flight(self, count: int) -> None: ...
    def committed(self, topic: str, partition: int, offset: int) -> None: ...
    def lag(self, topic: str, partition: int, lag: int) -> None: ...
    def latency(self, seconds: float) -> None: ...
    def rescored_after_pause(self, pairs: int) -> None: ...


def _ignore(*_: Any, **__: Any) -> None:
    return None


class Silent:
    """Accepts every report of every protocol and ignores it. Tests subclass it and define the
    reports they look at."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):  # copy, pickle and friends must not take it for theirs
            raise AttributeError(name)
        return _ignore


SILENT: Any = Silent()  # Any: it stands in for whichever protocol a loop reports through
