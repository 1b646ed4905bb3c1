"""Errors as ``application/problem+json`` (RFC 9457): every refusal the API gives has one shape,
with the field path of each problem in wire names (``members[1].refId``), as the catalog says it.
"""

from __future__ import annotations

from typing import Any

import orjson
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException as StarletteHTTPException

from adapters.stores.client import PoolBusy
from consumers.outage import outage_of
from scoring.errors import REFUSED, CatalogError, ScoringError, format_errors

log = structlog.get_logger(__name__)

PROBLEM_JSON = "application/problem+json"
RETRY_AFTER_S = "1"  # a refusal that may succeed later (``retriable``): when to ask again
TITLES = {400: "Invalid request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
          405: "Method not allowed", 408: "Request timeout", 409: "Conflict", 412: "Precondition failed",
          413: "Content Too Large", 415: "Unsupported media type", 429: "Too many requests", 500: "Internal error",
          503: "Service unavailable"}


class FieldProblem(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    field: str = Field(description="The field's path in wire names, e.g. members[1].refId; "
                                   "'(document)' for the whole body.")
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details, with ``errors`` listing each field that is wrong."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldProblem] = Field(default_factory=list)


def _field_problem(line: str) -> FieldProblem:
    path, sep, message = line.partition(": ")
    if not sep or " " in path:
        return FieldProblem(field="(document)", message=line)
    return FieldProblem(field=path, message=message)


def problem(status: int, detail: str, request: Request | None = None, errors: list[str] | None = None,
            headers: dict[str, str] | None = None) -> JSONResponse:
    body = Problem(title=TITLES.get(status, "Error"), status=status, detail=detail,
                   instance=request.url.path if request is not None else None,
                   errors=[_field_problem(e) for e in errors or []])
    return JSONResponse(body.model_dump(mode="json", by_alias=True), status_code=status,
                        media_type=PROBLEM_JSON, headers=headers)


def install(app: FastAPI) -> None:
    """Map every error the app can raise to a problem response."""

    @app.exception_handler(CatalogError)
    async def catalog_error(request: Request, exc: CatalogError) -> JSONResponse:
        response = problem(exc.status, exc.message, request, exc.errors if exc.status == 400 else [])
        extension = getattr(exc, "extension", None)  # RFC 9457 extension members (a budget's state)
        if extension:
            response = JSONResponse({**orjson.loads(bytes(response.body)), **extension}, status_code=exc.status,
                                    media_type=PROBLEM_JSON)
        return response

    @app.exception_handler(ScoringError)
    async def scoring_error(request: Request, exc: ScoringError) -> JSONResponse:
        """A refusal of the engine's (429: too many at once): its status and words. A failure
        (5xx) says only that it failed - its words may name the infrastructure."""
        if exc.status >= 500:
            log.error("request failed", path=request.url.path, error=type(exc).__name__)
            return problem(exc.status, "the request failed; try again later", request)
        return problem(exc.status, str(exc), request,
                       headers={"Retry-After": RETRY_AFTER_S} if exc.retriable else None)

    @app.exception_handler(RedisError)
    async def store_error(request: Request, exc: RedisError) -> JSONResponse:
        """The store unreachable for now, or every connection of the pool busy: 503, ask again (the
        SDK retries it). Any other answer of Redis is a failure of ours: 500, saying nothing of it."""
        if isinstance(exc, PoolBusy) or outage_of(exc) is not None:
            log.warning("request answered 503: the store is unreachable or busy", path=request.url.path,
                        error=type(exc).__name__)
            return problem(503, "the API cannot reach its store for now; retry shortly", request,
                           headers={"Retry-After": RETRY_AFTER_S})
        log.error("request failed", path=request.url.path, error=type(exc).__name__)
        return problem(500, "internal error", request)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        """Anything else: a problem document too (never a text/plain 500), saying nothing of it."""
        log.error("request failed", path=request.url.path, error=type(exc).__name__)
        return problem(500, "internal error", request)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = format_errors([{**e, "loc": _wire_loc(e.get("loc", ()))} for e in exc.errors()])
        return problem(400, REFUSED + "; ".join(errors), request, errors)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(exc.status_code, str(exc.detail), request, headers=getattr(exc, "headers", None))


def _wire_loc(loc: Any) -> tuple[int | str, ...]:
    """FastAPI's location starts with where the value came from (``body``, ``query``); a query
    parameter keeps its name, a body field its path inside the body."""
    parts = tuple(loc)
    if parts and parts[0] == "body":
        return parts[1:]
    if parts and parts[0] in ("query", "path", "header"):
        return parts[1:]
    return parts


RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": Problem, "description": TITLES[status],
             "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}
    for status in (400, 401, 403, 404, 412)
}


def documented(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document, without FastAPI's default 422: request validation answers 400 here."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        doc = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        for path in doc.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        schemas = doc.get("components", {}).get("schemas", {})
        schemas.pop("HTTPValidationError", None)
        schemas.pop("ValidationError", None)
        _link_created_to_their_operations(doc["paths"])
        app.openapi_schema = doc
    return app.openapi_schema


def _link_created_to_their_operations(paths: dict[str, Any]) -> None:
    """OpenAPI links from each create (``POST /v1/x`` answering 201) to the operations on what it
    created (``/v1/x/{id}...``), so clients and stateful testers can follow them."""
    for collection, item in paths.items():
        created = item.get("post", {}).get("responses", {}).get("201")
        if created is None:
            continue
        links = {}
        for path, operations in paths.items():
            if not path.startswith(collection + "/{id}"):
                continue
            for operation in operations.values():
                links[operation["operationId"]] = {"operationId": operation["operationId"],
                                                   "parameters": {"id": "$response.body#/id"}}
        if links:
            created["links"] = links
