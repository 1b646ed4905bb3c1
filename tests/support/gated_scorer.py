"""An external scorer on loopback that holds chosen requests until the test releases them.

Tests of the live loop use it to keep one trace's work unfinished for as long as they like, so
what the loop commits meanwhile is decided by the code under test, never by timing.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HOLD = "[[hold]]"  # an output carrying this marker is answered only after release()
HELD_AT_MOST_S = 60.0  # a test that forgets to release still ends


class GatedScorer:
    """Answers ``{"score": 0.9}`` (or ``answer``) for every POST; requests whose subject output
    carries ``HOLD`` wait for ``release()``. Counts requests by subject output."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.answer = answer or {"score": 0.9}
        self.seen: Counter[str] = Counter()
        self.held = threading.Event()  # set once a held request has arrived
        self._released = threading.Event()
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
                output = str(body.get("output", ""))
                with outer._lock:
                    outer.seen[output] += 1
                if HOLD in output:
                    outer.held.set()
                    outer._released.wait(HELD_AT_MOST_S)
                payload = json.dumps(outer.answer).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/score"

    def requests(self, output: str) -> int:
        with self._lock:
            return self.seen[output]

    def release(self) -> None:
        self._released.set()

    def __enter__(self) -> GatedScorer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()
