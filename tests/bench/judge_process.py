"""The local judge server (devtools/judge_server.py) in its own process at a fixed latency.

    python -m tests.bench.judge_process LATENCY_S

Prints ``judge server listening on URL`` once, then ``count T N PEAK`` every 0.25 s: the
chat requests answered by monotonic time T, and the most answered at once. Serves until SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from devtools.judge_server import Behaviour, JudgeServer


def main(latency_s: float) -> None:
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    server = JudgeServer().start()
    server.set_default(Behaviour.deterministic(delay=latency_s))
    print(f"judge server listening on {server.base_url}", flush=True)
    total = 0
    try:
        while not done.wait(0.25):
            with server._lock:  # the bodies are not needed: count them and keep the process small
                total += len(server.requests)
                server.requests.clear()
            print(f"count {time.monotonic():.3f} {total} {server.peak_in_flight}", flush=True)
    finally:
        server.stop()

if __name__ == "__main__":
    main(float(sys.argv[1]))
