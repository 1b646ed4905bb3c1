"""Noticing that this process stood still: SIGSTOP, a VM paused or migrated, a long collection.

A member's deadline is counted on the clock, and the clock runs on while the process does not: a
worker resumed after 13 s finds every judge call it had in flight "timed out", though the judge
answered in 300 ms - a verdict that says nothing about the pair, and one no other worker would
publish. ``PauseWatch`` ticks on the event loop; a tick much later than asked for is a pause,
remembered for a while, so that the trace loop can ask whether a pair's scoring lived through
one (``since``) and score it afresh rather than publish what the pause did to it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

TICK_S = 0.1
PAUSE_S = 1.0  # a tick this late (or later) means the process did not run meanwhile
KEPT = 64  # pauses remembered (the newest); a pair's scoring lasts minutes at most


class PauseWatch:
    def __init__(self, *, tick_s: float = TICK_S, pause_s: float = PAUSE_S) -> None:
        self._tick_s = tick_s
        self._pause_s = pause_s
        self._last_tick = time.monotonic()
        self._ended: deque[float] = deque(maxlen=KEPT)  # when each pause ended (monotonic)
        self.pauses = 0  # how many were seen, for logs and tests

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self._tick_s)
            self._tick()

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_tick >= self._pause_s:
            self._ended.append(now)
            self.pauses += 1
        self._last_tick = now

    def since(self, began: float) -> bool:
        """Whether the process stood still at some moment after ``began`` (monotonic) - including
        a pause that is just ending, before the watch's own tick has run again."""
        if time.monotonic() - self._last_tick >= self._pause_s:
            return True
        return any(ended > began for ended in self._ended)
