"""Logging: structlog, JSON lines in production, a readable console for people.

A redaction processor runs before rendering so that no secret reaches a log line, whichever
code logged it: keys that name a secret are masked, bearer tokens and passwords inside URLs
are cut out of every string value.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

REDACTED = "[redacted]"

# Keys whose values are secrets whatever they hold.
_SECRET_KEY = re.compile(
    r"(api[_-]?key|apikey|secret|password|passwd|token|authorization|signature|credential)",
    re.IGNORECASE,
)
# user:password@ inside a URL: keep the user, drop the password.
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]+@",
                           re.IGNORECASE)
# Bearer tokens and OpenAI-style keys that end up inside messages or reprs.
_BEARER = re.compile(r"(bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
_KEY_LIKE = re.compile(r"\bsk-[A-Za-z0-9_-]{8,}")


def redact_text(text: str) -> str:
    text = _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return _KEY_LIKE.sub(REDACTED, text)


def _redact_value(key: str, value: Any) -> Any:
    if _SECRET_KEY.search(key) and value not in (None, "", False):
        return REDACTED
    if isinstance(value, str):
        return redact_text(value)
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
