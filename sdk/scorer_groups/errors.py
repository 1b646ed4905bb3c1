"""Typed errors: each carries the HTTP status and the problem body (RFC 9457) the API sent."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """The API refused a request. ``problem`` is the problem+json body (``title``, ``detail``,
    ``errors``: one ``{field, message}`` per wrong field)."""

    status: int

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        self.detail: str = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
        self.errors: list[dict[str, str]] = list(problem.get("errors") or [])
        super().__init__(f"{status}: {self.detail}")

    @property
    def fields(self) -> list[str]:
        """The wire paths of the fields the API named (``members[1].refId``)."""
        return [e.get("field", "") for e in self.errors]


class BadRequest(ApiError):
    """400: the request breaks a rule; ``errors`` name the fields."""


class Unauthorized(ApiError):
    """401: no key, an unknown key, or a revoked one."""


class Forbidden(ApiError):
    """403: visible but not yours to change (a shared scorer)."""


class NotFound(ApiError):
    """404: no such resource in your project."""


class Conflict(ApiError):
    """409: it conflicts with what is stored (a backfill that has already ended, cancelled)."""


class PreconditionFailed(ApiError):
    """412: it changed since you read it; read again and retry."""


class RateLimited(ApiError):
    """429, after the client's retries ran out."""


class ServerError(ApiError):
    """5xx, after the client's retries ran out (for 503)."""


BY_STATUS: dict[int, type[ApiError]] = {400: BadRequest, 401: Unauthorized, 403: Forbidden, 404: NotFound,
                                        409: Conflict, 412: PreconditionFailed, 429: RateLimited}


def error_for(status: int, problem: dict[str, Any]) -> ApiError:
    cls = BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return cls(status, problem)
