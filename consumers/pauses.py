"""Noticing that this process stood still: SIGSTOP, a VM paused or migrated, a long collection.

A member's deadline is counted on the clock, and the clock runs on while the process does not: a
worker resumed after 13 s finds every judge call it had in flight "timed out", though the judge
answered in 300 ms - a verdict that says nothing about the pair, and one no other worker would
publish. ``PauseWatch`` ticks on the event loop; a tick much later than asked for is a pause,
remembered for a while, so that the trace loop and the session sweep can ask whether a pair's
scoring lived through one (``failed_through``) and score it afresh rather than publish what the
pause did to it. A watch that is not running sees no pause.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from scoring.panel import GroupResult

TICK_S = 0.1
PAUSE_S = 1.0  # a tick this late (or later) means the process did not run meanwhile
KEPT = 64  # pauses remembered (the newest); a pair's scoring lasts minutes at most


class PauseWatch:
    def __init__(self, *, tick_s: float = TICK_S, pause_s: float = PAUSE_S) -> None:
        self._tick_s = tick_s
        self._pause_s = pause_s
        self._last_tick = time.monotonic()
        self._ended: deque[float] = deque(maxlen=KEPT)  # when each pause ended (monotonic)
        self._running = 0  # loops running the watch (the trace loop and the sweep may share one)
        self.pauses = 0  # how many were seen, for logs and tests

    async def run(self, stop: asyncio.Event) -> None:
        self._running += 1
        self._last_tick = time.monotonic()
        try:
            while not stop.is_set():
                await asyncio.sleep(self._tick_s)
                self._tick()
        finally:
            self._running -= 1

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_tick >= self._pause_s:
            self._ended.append(now)
            self.pauses += 1
        self._last_tick = now

    def since(self, began: float) -> bool:
        """Whether the process stood still at some moment after ``began`` (monotonic) - including
        a pause that is just ending, before the watch's own tick has run again."""
        if not self._running:
            return False
        if time.monotonic() - self._last_tick >= self._pause_s:
            return True
        return any(ended > began for ended in self._ended)

    def failed_through(self, result: GroupResult, began: float) -> bool:
        """A member of ``result`` (scored from ``began`` on) failed while the process stood still:
        its deadline counted the pause, so its failure says nothing about the pair."""
        return self.since(began) and any(m.status == "failed" for m in result.blend.members)
