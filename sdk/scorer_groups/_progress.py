"""One line of progress on stderr, redrawn in place: a dataset run's rows (``_evaluations_shared``)
and a backfill job (``backfills``) draw the same bar. Nothing is drawn unless the caller shows it
- on a terminal, so that a CI log stays clean."""

from __future__ import annotations

import sys

WIDTH = 30


def bar(fraction: float, width: int = WIDTH) -> str:
    """``[#########.....]``: ``fraction`` (clamped to 0..1) of ``width`` filled."""
    filled = int(width * min(max(fraction, 0.0), 1.0))
    return f"[{'#' * filled}{'.' * (width - filled)}]"


class Line:
    """The line being redrawn; ``last`` ends it with a newline, so later output starts clean."""

    def __init__(self, shown: bool) -> None:
        self.shown = shown
        self._drawn = 0  # the length of what is on the line now

    def draw(self, text: str, *, last: bool = False) -> None:
        if not self.shown:
            return
        # Padded to what was drawn before: a shorter line must not leave a longer one's tail.
        sys.stderr.write("\r" + text.ljust(self._drawn) + ("\n" if last else ""))
        sys.stderr.flush()
        self._drawn = 0 if last else len(text)
