"""Turning a Kafka record into a Trace, or into a dead letter that says why not.

A record is refused when it is over the size limit, not UTF-8, not JSON, or not a valid trace;
the dead letter keeps the record as received (base64 when it is not text) with its position,
so nothing is lost and the producer's owner can see exactly what was wrong.
"""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from scoring.errors import field_errors
from scoring.subjects import Trace

DeadLetterReason = Literal[
    "too_large", "not_utf8", "not_json", "invalid_trace", "too_deep", "unprocessable",  # traces
    "not_otlp", "no_project", "invalid_span", "over_quota",  # OpenTelemetry spans (consumers/otlp.py)
]

# JSON nesting a trace may have. Every later step (orjson's encoder stops at 255 levels, pydantic,
# the session store) accepts far more; a record nested deeper is refused here, whole, rather
# than failing halfway through scoring.
MAX_NESTING = 64


def nesting_depth(document: object, limit: int = MAX_NESTING) -> int:
    """How deeply ``document`` nests lists and objects, counting no further than ``limit + 1``
    (iterative: a hostile document cannot exhaust the stack)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children: object = value.values()
        elif isinstance(value, list):
            children = value
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)  # type: ignore[attr-defined]
    return deepest


class DeadLetter(BaseModel):
    """The value on the dead-letter topic."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, frozen=True)

    reason: DeadLetterReason
    error: str
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str
    value_encoding: Literal["utf-8", "base64"]
    received_at: datetime
    # A record too large for the dead-letter topic keeps a prefix: its size and hash say what
    # it was, so it can be found and matched at its source.
    value_truncated: bool = False
    value_bytes: int = 0
    value_sha256: str = ""

    @property
    def kafka_key(self) -> bytes | None:
        return self.key.encode() if self.key else None

    def to_json(self) -> bytes:
        return self.model_dump_json(by_alias=True).encode()


def _as_text(raw: bytes | None) -> tuple[str, Literal["utf-8", "base64"]]:
    if raw is None:
        return "", "utf-8"
    try:
        return raw.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode(), "base64"


def unprocessable(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                  error: str, max_bytes: int) -> DeadLetter:
    """The dead letter of a record that decoded but broke a later step (routing, scoring): the
    loop goes on without it, and its owner sees why."""
    return dead_letter("unprocessable", error, topic, partition, offset, key, value, 3 * max_bytes)


def dead_letter(reason: DeadLetterReason, error: str, topic: str, partition: int, offset: int,
                key: bytes | None, value: bytes | None, keep_bytes: int) -> DeadLetter:
    """The dead letter of a record: its position, key and value as received (base64 when not
    text), a prefix only past ``keep_bytes`` with the whole value's size and hash."""
    raw = value or b""
    kept = raw[:keep_bytes]
    text, encoding = _as_text(kept)
    return DeadLetter(reason=reason, error=error, topic=topic, partition=partition, offset=offset,
                      key=_as_text(key[:1024])[0] if key is not None else None, value=text,
                      value_encoding=encoding, received_at=datetime.now(UTC),
                      value_truncated=len(kept) < len(raw), value_bytes=len(raw),
                      value_sha256=hashlib.sha256(raw).hexdigest())


def decode_trace(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 max_bytes: int, max_dead_letter_bytes: int | None = None) -> Trace | DeadLetter:
    """The trace in a record, or the dead letter saying why there is none. A dead letter keeps
    the whole value unless it exceeds ``max_dead_letter_bytes`` (default: 3 × ``max_bytes``)."""
    keep_bytes = max_dead_letter_bytes or 3 * max_bytes

    def dead(reason: DeadLetterReason, error: str) -> DeadLetter:
        return dead_letter(reason, error, topic, partition, offset, key, value, keep_bytes)

    if value is None:
        return dead("not_json", "the record has no value (a tombstone)")
    if len(value) > max_bytes:
        return dead("too_large", f"the record is {len(value)} bytes, over the limit of {max_bytes}")
    try:
        document = orjson.loads(value)  # refuses text that is not UTF-8, too
    except orjson.JSONDecodeError as exc:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError as not_utf8:
            return dead("not_utf8", f"the value is not UTF-8: {not_utf8.reason} at byte {not_utf8.start}")
        return dead("not_json", f"the value is not JSON: {exc}")
    # A value with few brackets cannot nest deeply: count them (fast) before walking it.
    if value.count(b"{") + value.count(b"[") > MAX_NESTING and nesting_depth(document) > MAX_NESTING:
        return dead("too_deep", f"the value nests lists and objects deeper than {MAX_NESTING} levels")
    try:
        return Trace.model_validate(document)
    except ValidationError as exc:
        return dead("invalid_trace", "; ".join(field_errors(exc)))
