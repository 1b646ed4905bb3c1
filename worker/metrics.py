"""Prometheus metrics and the operations endpoint (/metrics, /healthz, /readyz).

All metrics live in one registry owned by this module, so a test can read them and a second
worker in the same process (tests) does not collide with the default registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = structlog.get_logger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

ReadinessCheck = Callable[[], tuple[bool, str]]


class OpsServer:
    """A tiny HTTP/1.1 server on asyncio: scraping must not depend on the event loop's load
    more than it has to, and it must not pull in a web framework."""

    def __init__(self, port: int, readiness: ReadinessCheck | None = None,
                 host: str = "0.0.0.0") -> None:
        self._port = port
        self._host = host
        self._readiness = readiness or (lambda: (True, "ready"))
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None, "start() first"
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self._host, self._port)
        log.info("ops endpoint listening", port=self.port, paths=["/metrics", "/healthz", "/readyz"])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), timeout=5)
            while (await asyncio.wait_for(reader.readline(), timeout=5)) not in (b"\r\n", b"\n", b""):
                pass  # headers are not needed
            parts = request_line.decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            status, ctype, body = self._route(path)
            head = (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()

    def _route(self, path: str) -> tuple[str, str, bytes]:
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(REGISTRY)
        if path == "/healthz":
            return "200 OK", "text/plain", b"ok\n"
        if path == "/readyz":
            ready, why = self._readiness()
            return ("200 OK" if ready else "503 Service Unavailable"), "text/plain", (why + "\n").encode()
        return "404 Not Found", "text/plain", b"not found\n"
