"""Request bodies read and validated without blocking the event loop.

The one rule: a body of at most ``INLINE_BYTES`` is validated on the loop; a larger one first takes a
reading turn shared fairly across projects, then is validated in a parser process. A route reads its body
with ``read_body`` and declares it with ``body_doc``. Why, and the memory bound: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import importlib
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from scoring.errors import CatalogError, shown_value
from scoring.members.fair_share import FairShare
from worker.api.door import CEILING_KEY, SMALL_BODY, ceiling

M = TypeVar("M", bound=BaseModel)
INLINE_BYTES = 64 * 1024


class BodyTooSlow(CatalogError):
    """408: a large body did not arrive within SGW_API_BODY_READ_TIMEOUT_S."""

    status = 408


class BodyParser:
    """One per API process: the turns to read large bodies, and the parser processes."""

    def __init__(self, processes: int, readers: int, read_timeout_s: float) -> None:
        # Reading turns are shared fairly across projects (scoring.members.fair_share): a tenant
        # whose bodies trickle in holds at most its share, each for at most the read timeout.
        self._reading = FairShare(readers)
        self._parsing = asyncio.Semaphore(processes)
        self._processes, self._read_timeout_s = processes, read_timeout_s
        self._pool: ProcessPoolExecutor | None = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    async def read(self, request: Request, model: type[M], then: Callable[[Any], Any] | None) -> Any:
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) <= INLINE_BYTES:
            return _unwrap(_validate(_ref(model), await request.body(), _ref(then)))  # 1.
        key = getattr(request.state, "api_key", None)
        project = getattr(key, "project", None) or "(operators)"
        async with self._reading.slot(project):  # 2. held until parsed: the bodies in memory are bounded
            try:
                raw = await asyncio.wait_for(request.body(), self._read_timeout_s)
            except TimeoutError:
                raise BodyTooSlow(f"the request body did not arrive within {self._read_timeout_s:g} s") from None
            if len(raw) <= INLINE_BYTES:
                return _unwrap(_validate(_ref(model), raw, _ref(then)))
            async with self._parsing:
                loop = asyncio.get_running_loop()
                try:
                    outcome = await loop.run_in_executor(self._executor(), _validate, _ref(model), raw, _ref(then))
                except BrokenProcessPool:  # a parser died (memory): a fresh pool for the next body
                    self._pool = None
                    raise CatalogError("the request body could not be parsed (the parser ran out of room)") from None
            return _unwrap(outcome)

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the API process holds threads, sockets and the sandbox pool.
            self._pool = ProcessPoolExecutor(self._processes, mp_context=multiprocessing.get_context("spawn"))
        return self._pool


async def read_body(request: Request, model: type[M], then: Callable[[Any], Any] | None = None) -> Any:
    """The request's body validated as ``model``; ``then`` - a module-level function, since it
    may run in a parser process - is applied to the model there, and its result returned."""
    parser: BodyParser = request.app.state.bodies
    return await parser.read(request, model, then)


DOCUMENTED: dict[str, type[BaseModel]] = {}  # models of the bodies routes read with read_body


def body_doc(model: type[BaseModel], max_bytes: int) -> dict[str, Any]:
    """A route's ``openapi_extra``: its ceiling, and its request body documented as ``model``."""
    DOCUMENTED[model.__name__] = model
    return {**ceiling(max_bytes), "requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def with_body_schemas(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the schemas of the bodies read by read_body (FastAPI sees no parameter), and
    every operation that takes a body saying its ceiling."""
    for operations in doc.get("paths", {}).values():
        for operation in operations.values():
            if "requestBody" in operation:
                operation.setdefault(CEILING_KEY, SMALL_BODY)
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for name, model in DOCUMENTED.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for def_name, definition in schema.pop("$defs", {}).items():
            schemas.setdefault(def_name, definition)
        schemas.setdefault(name, schema)
    return doc


def _ref(thing: Any) -> tuple[str, str] | None:
    return None if thing is None else (thing.__module__, thing.__qualname__)


def _resolve(ref: tuple[str, str]) -> Any:
    module, name = ref
    return getattr(importlib.import_module(module), name)


def _validate(model_ref: tuple[str, str] | None, raw: bytes, then_ref: tuple[str, str] | None) -> tuple[str, Any]:
    """In whichever process: ("ok", value), ("invalid", pydantic's errors) or ("refused",
    (message, errors)) - plain values, so they cross a process boundary intact."""
    assert model_ref is not None
    try:
        value = _resolve(model_ref).model_validate_json(raw)
        if then_ref is not None:
            value = _resolve(then_ref)(value)
    except ValidationError as exc:
        return "invalid", [_portable(e) for e in exc.errors(include_url=False, include_context=False)]
    except CatalogError as exc:
        return "refused", (type(exc).__module__, type(exc).__qualname__, exc.message, exc.errors)
    return "ok", value


def _portable(error: Any) -> dict[str, Any]:
    """A pydantic error as FastAPI would raise it (``loc`` under ``body``), its input cut to what
    the problem shows of it (``scoring.errors.format_errors``): never a whole body back."""
    got = error.get("input")
    if error["type"] not in ("missing", "extra_forbidden") and not isinstance(got, dict | list):
        error = {**error, "msg": f"{error['msg']} (got {shown_value(got)})"}
    return {**error, "input": [], "loc": ("body", *error["loc"])}


def _unwrap(outcome: tuple[str, Any]) -> Any:
    kind, value = outcome
    if kind == "invalid":
        raise RequestValidationError(value)
    if kind == "refused":
        module, name, message, errors = value
        raise _resolve((module, name))(message, errors=errors)
    return value
