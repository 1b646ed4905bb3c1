"""Logging: structlog, JSON lines in production, a readable console for people.

A redaction processor runs before rendering so that no secret reaches a log line, whichever
code logged it: keys that name a secret are masked, bearer tokens and passwords inside URLs
are cut out of every string value.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from scoring.redact import REDACTED, SECRET_NAME, Redactor, redact_text

__all__ = ["REDACTED", "configure_logging", "redact_secrets", "redact_text", "use_known_secrets"]

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
