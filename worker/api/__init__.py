"""``scorer-worker api``: the scorer-groups API over HTTP (FastAPI, served by uvicorn).

    /v1/scorer-groups[/{id}[/ratings|/changes]]   the spec's SDK surface
    /v1/sessions/{sessionId}/scores
    /v1/judges, /v1/patterns, /v1/customs, /v1/budgets/{projectId}, /v1/channels
    /v1/datasets[/{id}[/versions|/rows]], /v1/evaluations[/{id}[/finalize]]   dataset runs
    /metrics (Prometheus), /healthz, /openapi.json, /docs

Every /v1 request carries ``Authorization: Bearer <key>`` (``scorer-worker keys create``) and acts
for the key's project. The API writes the same Redis catalog the workers watch, so a change is
live in running workers within a second.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import structlog
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from adapters.stores.catalog import SnapshotCache
from adapters.stores.claims import Claims
from adapters.stores.verdicts import VerdictStore
from scoring.members.fair_share import FairShare
from services.playground import Playground
from worker.alignment_runner import AlignmentRunner
from worker.api import (
    alignments,
    backfills,
    console_pages,
    docs_pages,
    evaluations,
    groups,
    incidents,
    problems,
    reviews,
    scorers,
)
from worker.api.bodies import BodyParser, with_body_schemas
from worker.api.door import Door
from worker.connections import redis_client
from worker.engine import ScoringEngine
from worker.loop_stall import watch_loop_stalls
from worker.metrics import API_REQUEST_SECONDS, API_REQUESTS, REGISTRY
from worker.settings import Settings
from worker.shutdown import close_all

log = structlog.get_logger(__name__)

API_VERSION = "1.0.0"
RUN_READS = 4  # whole evaluation runs read and encoded at once (each up to tens of MB), 2 per project
ESTIMATES = 2  # backfill dry runs at once (each a Kafka consumer reading the topic), 1 per project


def create_app(settings: Settings) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = redis_client(settings)
        app.state.snapshots = SnapshotCache()
        # One engine for every request: dataset runs finalized at once share its judge cap and
        # sandbox pool, as the worker's traces do.
        app.state.engine = await ScoringEngine(settings).start()
        policy = app.state.engine.panel.verdict_cache
        verdicts = VerdictStore(app.state.redis, policy) if policy is not None else None
        app.state.playground = Playground(app.state.engine.panel, Claims(app.state.redis), verdicts=verdicts)
        app.state.bodies = BodyParser(settings.api_body_parsers, settings.api_body_readers,
                                      settings.api_body_read_timeout_s)
        # Whole evaluation runs read at once (worker.api.evaluations), shared fairly by projects.
        app.state.run_reads = FairShare(RUN_READS, per_project=RUN_READS // 2)
        # Backfill dry runs (worker.api.backfills): one reader of the traces topic each, queued fairly.
        app.state.estimates = FairShare(ESTIMATES, per_project=1)
        # Alignment runs are jobs: this process grades its share, and resumes those whose process died.
        app.state.alignments = AlignmentRunner(app.state.engine, app.state.redis).start()
        stalls_stop = asyncio.Event()
        stalls = asyncio.create_task(watch_loop_stalls(stalls_stop), name="event-loop stall watch")
        try:
            yield
        finally:
            stalls_stop.set()
            await stalls
            app.state.bodies.close()
            await app.state.alignments.close()  # their leases given back: another process resumes them
            await close_all([("scoring engine", app.state.engine.close()), ("redis", app.state.redis.aclose())])

    app = FastAPI(title="Scorer groups API", version=API_VERSION, lifespan=lifespan,
                  summary="Scorer groups, the scorers they blend, budgets and alert channels.",
                  responses=problems.RESPONSES,
                  generate_unique_id_function=lambda route: route.name,  # operationIds: list_groups, ...
                  docs_url=None, redoc_url=None)  # FastAPI's pages load scripts from a CDN: docs_pages instead
    app.state.settings = settings  # what routes read of them (worker.api.evaluations: the project quotas)
    problems.install(app)
    app.openapi = lambda: with_body_schemas(problems.documented(app))  # type: ignore[method-assign]
    app.include_router(groups.router)
    app.include_router(scorers.router)
    app.include_router(alignments.router)
    app.include_router(console_pages.router)
    app.include_router(docs_pages.router)
    app.include_router(evaluations.router)
    app.include_router(backfills.router)
    app.include_router(incidents.router)
    app.include_router(reviews.router)
    app.add_middleware(Door, max_bytes=settings.api_max_body_bytes)  # bodies bounded, keys checked first

    @app.middleware("http")
    async def measure(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")  # templates, never raw ids: bounded labels
        API_REQUESTS.labels(template, request.method, str(response.status_code)).inc()
        API_REQUEST_SECONDS.labels(template, request.method).observe(time.perf_counter() - started)
        return response

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", include_in_schema=False, response_class=PlainTextResponse)
    async def healthz() -> str:
        return "ok\n"

    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 picks a free one (read it back from the socket)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it (Linux): a response's head and body go out as written.
    # Without it, Nagle held the body until the client acknowledged the head, and the client
    # delays that acknowledgement: 40-44 ms on every request of a kept-alive connection.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def serve(settings: Settings) -> int:
    sock = bind(settings.api_host, settings.api_port)
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(settings), log_config=None, access_log=False,
                            proxy_headers=False, server_header=False)
    server = uvicorn.Server(config)
    log.info("api listening", host=settings.api_host, port=port, docs=f"http://{settings.api_host}:{port}/docs")
    await server.serve(sockets=[sock])
    return 0
