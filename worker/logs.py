"""Logging: structlog, JSON lines in production, a readable console for people.

A redaction processor runs before rendering so that no secret reaches a log line, whichever
code logged it: keys that name a secret are masked, bearer tokens and passwords inside URLs
are cut out of every string value.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any

import structlog
from aiokafka import errors as kafka_errors

from scoring.redact import REDACTED, SECRET_NAME, Redactor, redact_text

__all__ = ["REDACTED", "configure_logging", "kafka_errors_kept", "redact_secrets", "redact_text", "use_known_secrets"]

# The process's known secrets (settings, secret-named variables), cut wherever they appear.
_redact: Redactor = Redactor.from_environment()


def use_known_secrets(secrets: list[str]) -> None:
    """Also cut these values (the settings' secrets) from every log line."""
    global _redact
    _redact = Redactor.from_environment(secrets)


def _redact_value(key: str, value: Any) -> Any:
    if SECRET_NAME.search(key) and value not in (None, "", False):
        return REDACTED
    if isinstance(value, str):
        return _redact(value)
    if isinstance(value, dict):
        return {k: _redact_value(str(k), v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact_value(key, v) for v in value]
    return value


def redact_secrets(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: mask secret-named keys and secrets embedded in strings."""
    for key in list(event_dict):
        event_dict[key] = _redact_value(key, event_dict[key])
    return event_dict


def configure_logging(log_format: str = "json", level: str = "info") -> None:
    numeric_level = logging.getLevelNamesMapping()[level.upper()]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Libraries (aiokafka, httpx) log through the standard library: keep them quiet.
    logging.basicConfig(level=max(numeric_level, logging.WARNING), stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        handler.addFilter(SettlingChatter(show_debug=numeric_level <= logging.DEBUG))


# What aiokafka logs, as warnings and errors, while a cluster settles: a fresh topic's leaders
# being elected, the group coordinator starting, metadata not yet there. Each is retried by the
# client and needs nobody; a broker that cannot be reached at all (KafkaConnectionError) or any
# other error keeps its level, and the worker's own outage rule reports a lasting fault.
SETTLING = re.compile("|".join(cls.__name__ for cls in (
    kafka_errors.NotLeaderForPartitionError, kafka_errors.LeaderNotAvailableError,
    kafka_errors.GroupCoordinatorNotAvailableError, kafka_errors.CoordinatorNotAvailableError,
    kafka_errors.CoordinatorLoadInProgressError, kafka_errors.GroupLoadInProgressError,
    kafka_errors.NotCoordinatorForGroupError, kafka_errors.NotCoordinatorError,
    kafka_errors.UnknownTopicOrPartitionError, kafka_errors.StaleMetadata)) + "|not found in cluster metadata")


class SettlingChatter(logging.Filter):
    """Moves aiokafka's settling chatter (SETTLING) to debug: shown only when debug is."""

    def __init__(self, show_debug: bool) -> None:
        super().__init__()
        self._show_debug = show_debug

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("aiokafka") or record.levelno <= logging.DEBUG:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if SETTLING.search(record.getMessage()) or (exc is not None and SETTLING.search(type(exc).__name__)):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return self._show_debug
        return True


@contextlib.contextmanager
def kafka_errors_kept() -> Iterator[list[str]]:
    """While active, aiokafka's error lines (a refused password, an untrusted certificate, a
    connection refused) are kept in the list it yields instead of printed: the caller says what
    failed once, with the setting to look at, rather than a line per attempt."""
    kept: list[str] = []

    class Keep(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.name.startswith("aiokafka") and record.levelno >= logging.ERROR:
                kept.append(record.getMessage())
                return False
            return True

    keep = Keep()
    handlers = logging.getLogger().handlers
    for handler in handlers:
        handler.addFilter(keep)
    try:
        yield kept
    finally:
        for handler in handlers:
            handler.removeFilter(keep)
