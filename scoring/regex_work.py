"""A tenant's regex, run within bounds: how much text one search reads, and how much matching one trace may cost.

RE2 is linear in the text times the program, so the bound is on the worst case: a search reads at most
``work // programsize`` characters, and a trace's filters share ``FILTER_SECONDS_PER_TRACE`` of matching.
The one rule: what could not be read or timed out is unknown, and fails closed. Why: docs/design-notes.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import re2

from scoring.re2_search import matches

MAX_FILTER_TEXT_CHARS: Final = 65_536  # of one field a filter's `matches` reads
FILTER_SEARCH_WORK: Final = 4_000_000  # instruction x characters of one filter search: <= ~30 ms worst here
FILTER_SECONDS_PER_TRACE: Final = 0.05  # of matching, over all of a trace's filters


def readable_chars(regex: re2._Regexp, work: int, cap: int) -> int:
    """How many characters of a text one search of ``regex`` may read: its worst case within
    ``work``, and never more than ``cap``."""
    size: int = regex.programsize
    return max(1, min(cap, work // max(1, size)))


class RegexWork:
    """One trace's allowance of filter matching (shared by its trace view and its span views).
    ``cut``: searches that read less than the whole text; ``refused``: searches not run because
    the trace's time was spent."""

    __slots__ = ("cut", "refused", "seconds_left")

    def __init__(self, seconds: float = FILTER_SECONDS_PER_TRACE) -> None:
        self.seconds_left = seconds
        self.cut = 0
        self.refused = 0

    def search(self, regex: re2._Regexp, text: str) -> bool | None:
        """Does ``regex`` match in (the readable start of) ``text``? None: it cannot tell - the
        trace's matching time is spent, or nothing matched in the start of a text it could not
        read whole (so that ``not matches`` fails closed: a match may sit past the cut)."""
        return self._timed(lambda read: matches(regex, read), text,
                           readable_chars(regex, FILTER_SEARCH_WORK, MAX_FILTER_TEXT_CHARS))

    def contains(self, needle: str, text: str) -> bool | None:
        """Is ``needle`` in (the readable start of) ``text``? As ``search``: a substring scan
        costs its text too, and a filter holds many."""
        return self._timed(lambda read: needle in read, text, MAX_FILTER_TEXT_CHARS)

    def _timed(self, find: Callable[[str], bool], text: str, limit: int) -> bool | None:
        if self.seconds_left <= 0.0:
            self.refused += 1
            return None
        cut = len(text) > limit
        if cut:
            text = text[:limit]
            self.cut += 1
        started = time.perf_counter()
        found = find(text)
        self.seconds_left -= time.perf_counter() - started
        return True if found else (None if cut else False)

    @property
    def exhausted(self) -> bool:
        return self.refused > 0
