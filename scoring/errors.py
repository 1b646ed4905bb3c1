"""The service's errors: one root, ``ScoringError``, whose attributes are what callers branch on.

The one rule: branch on ``status`` (how the HTTP API answers it) and ``retriable`` (the same call may
succeed later), never on the message, which is for people. Whether an error means a dependency is away
is decided in one place: ``consumers.outage.outage_of``. The statuses and where each error lives:
docs/design-notes.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError


class ScoringError(Exception):
    """The root of the service's errors; see the module's docstring for what each flag means."""

    status: int = 500
    retriable: bool = False


class TooMany(ScoringError):
    """429: a project has as many of something in flight as it may; ask again shortly."""

    status = 429
    retriable = True


class CatalogError(ScoringError):
    """A catalog operation was refused; ``status`` says how the HTTP API answers."""

    status = 400

    def __init__(self, message: str, *, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errors = errors or [message]


REFUSED = "invalid request: "  # one wording for a refused document, whichever layer found the fault
SHOWN_VALUE_CHARS = 80  # of an offending value echoed back: enough to recognise it, never all of it


class InvalidDocument(CatalogError):
    status = 400

    @classmethod
    def of(cls, errors: list[str]) -> InvalidDocument:
        """Refused for ``errors`` ('<field path>: <what is wrong>'), in the one wording."""
        return cls(REFUSED + "; ".join(errors), errors=errors)

    @classmethod
    def from_validation(cls, exc: ValidationError) -> InvalidDocument:
        return cls.of(field_errors(exc))


class NotFound(CatalogError):
    status = 404


class Conflict(CatalogError):
    status = 409


class Forbidden(CatalogError):
    """The caller may see the document but not change it (a shared scorer, for a project key)."""

    status = 403


class PreconditionFailed(CatalogError):
    """The document changed since the caller read it (its ETag no longer matches)."""

    status = 412


class QuotaExceeded(CatalogError):
    """409: the project keeps as much as its quota allows. ``extension`` names the quota."""

    status = 409

    def __init__(self, setting: str, what: str, used: int, limit: int) -> None:
        super().__init__(f"quota {setting}: the project keeps {used:,} {what}, at most {limit:,}")
        self.extension = {"quota": {"setting": setting, "used": used, "limit": limit}}


def _location(loc: tuple[int | str, ...]) -> str:
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            path += ("." if path else "") + part
    return path or "(document)"


def _internal_step(part: int | str) -> bool:
    return isinstance(part, str) and part.startswith(("function-", "tagged-"))


def shown_value(value: Any) -> str:
    """``repr(value)``, cut when long: a 2,000-character description is named, not echoed."""
    text = repr(value)
    if len(text) <= SHOWN_VALUE_CHARS:
        return text
    size = f", {len(value):,} characters" if isinstance(value, str | bytes) else ""
    return f"{text[:SHOWN_VALUE_CHARS]}… (cut{size})"


def field_errors(exc: ValidationError) -> list[str]:
    """Pydantic's errors as '<field path>: <what is wrong> (got <value>)', in wire names."""
    return format_errors(exc.errors(include_url=False))


def format_errors(errors: Sequence[Mapping[str, Any]]) -> list[str]:
    """Error dicts in pydantic's shape (``loc``, ``msg``, ``type``, ``input``) as field_errors."""
    messages = []
    for error in errors:
        # Union members and validators add their own names to the path; the user never wrote them.
        loc = tuple(p for p in error["loc"] if not _internal_step(p))
        message = error["msg"].removeprefix("Value error, ")
        got = error.get("input")
        suffix = "" if error["type"] in ("missing", "extra_forbidden") or isinstance(got, dict | list) \
            else f" (got {shown_value(got)})"
        messages.append(f"{_location(loc)}: {message}{suffix}")
    return messages
