"""A real local HTTP server for tests that stand in for external scorers and webhook receivers.

It speaks plain HTTP/1.1 on 127.0.0.1, records every request, and answers from a FIFO script
of responses (then a default one). No mocks: the code under test opens real sockets.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from devtools.local_http import LocalHttpServer, QuietHandler


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: Any = field(default_factory=lambda: {"score": 1.0})  # JSON-encoded unless bytes
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    trickle_s: float = 0.0  # send the body a byte at a time, spread over this many seconds


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)  # when the request arrived (wall clock)

    def json(self) -> Any:
        return json.loads(self.body)


class ScriptedServer(LocalHttpServer):
    def __init__(self, default: Reply | None = None) -> None:
        self.default = default or Reply()
        self.requests: list[Received] = []
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        outer = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.read_body()
                with outer._lock:
                    outer.requests.append(Received("POST", self.path,
                                                   {k.lower(): v for k, v in self.headers.items()}, body))
                    reply = outer._script.pop(0) if outer._script else outer.default
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    if reply.trickle_s:
                        for i in range(len(payload)):
                            self.wfile.write(payload[i:i + 1])
                            self.wfile.flush()
                            time.sleep(reply.trickle_s / len(payload))
                    else:
                        self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

        super().__init__(Handler)

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)
