"""One base for the harness's hand-written local HTTP servers (the judge, the webhook receiver, the
tests' scripted and gated scorers): a threaded HTTP/1.1 server on 127.0.0.1, never another address.

A subclass gives its request handler (usually a ``QuietHandler`` that reads bodies with
``read_body()``) and keeps its own state; the base binds a port (a free one unless given), serves
from a daemon thread with daemon handler threads, and stops cleanly:

    with ScriptedServer() as server:  # start() on enter, stop() on exit
        httpx.post(server.url + "/score", ...)

A server binds when it is made (``bind_now=True``: its ``url`` is known before ``start()`` and
still after ``stop()``), or on each ``start()`` (``bind_now=False``: it can be started again
after a stop, and has no port while stopped).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

HOST = "127.0.0.1"  # loopback only


class LoopbackServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` whose handler threads are daemons: a hung handler never keeps a
    process alive."""

    daemon_threads = True


class ClosingServer(LoopbackServer):
    """A quiet loopback server that also closes its open (keep-alive) connections on close, does
    not wait for handler threads, and takes bursts of concurrent connects (a listen backlog of 256,
    not the default 5, which resets them)."""

    block_on_close = False
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away mid-answer is not news

    def server_close(self) -> None:
        super().server_close()
        with self.connections_lock:  # wakes handler threads idling on keep-alive connections
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


class QuietHandler(BaseHTTPRequestHandler):
    """An HTTP/1.1 (keep-alive) request handler that logs nothing."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def read_body(self) -> bytes:
        """The request's body, as long as its Content-Length says (empty without one)."""
        return self.rfile.read(int(self.headers.get("content-length") or 0))


class LocalHttpServer:
    """A threaded HTTP server on 127.0.0.1 serving ``handler`` from a daemon thread.

    ``port`` 0 binds a free one. ``start()`` returns the server; ``stop()`` may be called whether
    or not it started, and more than once. ``base_url`` (and ``url``) is ``http://127.0.0.1:<port>``;
    a subclass may add a path to either."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, port: int = 0, bind_now: bool = True,
                 poll_interval_s: float = 0.05, thread_name: str | None = None,
                 server_class: type[LoopbackServer] = LoopbackServer) -> None:
        self._handler = handler
        self._requested_port = port
        self._bind_now = bind_now
        self._poll_interval_s = poll_interval_s
        self._thread_name = thread_name
        self._server_class = server_class
        self._httpd: LoopbackServer | None = self._bind() if bind_now else None
        self._thread: threading.Thread | None = None

    def _bind(self) -> LoopbackServer:
        return self._server_class((HOST, self._requested_port), self._handler)

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> Self:
        if self._httpd is None:
            self._httpd = self._bind()
        self._thread = threading.Thread(target=self._httpd.serve_forever,
                                        kwargs={"poll_interval": self._poll_interval_s},
                                        name=self._thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is not None:
            if thread is not None and thread.is_alive():  # shutdown() waits for serve_forever to have run
                httpd.shutdown()
            httpd.server_close()
            if not self._bind_now:
                self._httpd = None  # a new port on the next start
        if thread is not None:
            thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- where it listens -------------------------------------------------------------------

    @property
    def bound(self) -> bool:
        """Whether it holds a port (from when it is made, or while it runs if it binds on start)."""
        return self._httpd is not None

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"
