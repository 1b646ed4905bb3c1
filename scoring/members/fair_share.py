"""Fair shares of a pool a process holds for grading, across the projects that want it.

One rule for judge-call slots, code-scorer sandboxes and external-scorer connections: a project holds at
most ``per_project`` slots, and a freed slot goes to the waiting project that holds the fewest, so no
project keeps more than its share while another waits. One event loop, so no lock.
The rule in full: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from types import TracebackType


def default_share(size: int) -> int:
    """Rule 1's default cap: all but a sixteenth of the pool, at least one slot kept back (a
    pool of one has nothing to keep back)."""
    return max(1, size - max(1, -(-size // 16)))


class FairShare:
    def __init__(self, size: int, per_project: int | None = None, *,
                 closed: Callable[[], Exception] | None = None) -> None:
        if size < 1:
            raise ValueError("a pool needs at least one slot")
        self.size = size
        self.per_project = max(1, min(size, per_project or default_share(size)))
        self._held: dict[str, int] = {}
        self._in_use = 0
        # Waiting callers by project; the dict's order is the projects' turns (rule 3's ties).
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self._closed = closed  # set by close(): what a caller gets from then on
        self._is_closed = False

    @property
    def in_use(self) -> int:
        return self._in_use

    def held(self, project: str) -> int:
        return self._held.get(project, 0)

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def waiting_of(self, project: str) -> int:
        return len(self._waiting.get(project, ()))

    async def acquire(self, project: str) -> None:
        if self._is_closed:
            raise self._closed_error()
        if (project not in self._waiting and self._in_use < self.size
                and self._held.get(project, 0) < self.per_project):
            self._take(project)
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(project, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled() and turn.exception() is None:
                self.release(project)  # granted, but cancelled before it could run: hand it on
            else:
                self._forget(project, turn)
            raise

    def release(self, project: str) -> None:
        left = self._held[project] - 1
        if left:
            self._held[project] = left
        else:
            del self._held[project]
        self._in_use -= 1
        self._hand_on()

    def slot(self, project: str) -> _Slot:
        """``async with pool.slot(project):`` - acquired on entry, released on exit."""
        return _Slot(self, project)

    def close(self) -> None:
        """Every waiting caller, and every later one, fails with the ``closed`` error."""
        self._is_closed = True
        for queue in self._waiting.values():
            for turn in queue:
                if not turn.done():
                    turn.set_exception(self._closed_error())
        self._waiting.clear()

    def _closed_error(self) -> Exception:
        return self._closed() if self._closed is not None else RuntimeError("the pool is closed")

    def _take(self, project: str) -> None:
        self._held[project] = self._held.get(project, 0) + 1
        self._in_use += 1

    def _hand_on(self) -> None:
        while self._in_use < self.size and self._waiting:
            eligible = [p for p in self._waiting if self._held.get(p, 0) < self.per_project]
            if not eligible:
                return
            project = min(eligible, key=self.held)  # min keeps the first of equals: the oldest turn
            queue = self._waiting.pop(project)
            turn = queue.popleft()
            if queue:
                self._waiting[project] = queue  # back of the line: its next caller waits its turn
            if turn.done():  # cancelled while waiting; its task has not run yet to forget it
                continue
            self._take(project)
            turn.set_result(None)

    def _forget(self, project: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(project)
        if queue is not None and turn in queue:
            queue.remove(turn)
            if not queue:
                del self._waiting[project]


class _Slot:
    """A class, not a generator-based context manager: three times cheaper on every judge call."""

    __slots__ = ("_pool", "_project")

    def __init__(self, pool: FairShare, project: str) -> None:
        self._pool, self._project = pool, project

    async def __aenter__(self) -> None:
        await self._pool.acquire(self._project)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._pool.release(self._project)
