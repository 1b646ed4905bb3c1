"""An external scorer on loopback that holds chosen requests until the test releases them.

Tests of the live loop use it to keep one trace's work unfinished for as long as they like, so
what the loop commits meanwhile is decided by the code under test, never by timing.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

from devtools.local_http import LocalHttpServer, QuietHandler

HOLD = "[[hold]]"  # an output carrying this marker is answered only after release()
HELD_AT_MOST_S = 60.0  # a test that forgets to release still ends


class GatedScorer(LocalHttpServer):
    """Answers ``{"score": 0.9}`` (or ``answer``) for every POST; requests whose subject output
    carries ``HOLD`` wait for ``release()``. Counts requests by subject output."""

    def __init__(self, answer: dict[str, Any] | None = None) -> None:
        self.answer = answer or {"score": 0.9}
        self.seen: Counter[str] = Counter()
        self.held = threading.Event()  # set once a held request has arrived
        self._released = threading.Event()
        self._lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = json.loads(self.read_body())
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

        super().__init__(Handler)

    @property
    def url(self) -> str:
        return f"{self.base_url}/score"

    def requests(self, output: str) -> int:
        with self._lock:
            return self.seen[output]

    def release(self) -> None:
        self._released.set()

    def stop(self) -> None:
        self.release()  # held requests end first
        super().stop()
