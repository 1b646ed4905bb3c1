"""A tenant's regex, run within bounds: how much text one search reads, and how much matching
one trace may cost.

RE2 matches in linear time, but linear in the text *times the program*: a pattern such as
``a[ab]{999}[ab]{990}c`` (1,995 instructions, under the save-time cap) defeats RE2's DFA, and its
NFA then costs about 3-7 ns per instruction per character here - 9.7 s on a megabyte. A regex
that fast patterns read in microseconds (the DFA: ~3 ms a megabyte whatever the program) is
the same shape on the wire, so the bound is on the *worst case*, one search at a time:

1. **Text per search**: a search reads at most ``work // programsize`` characters of a field,
   and never more than the caller's own cap (``MAX_FILTER_TEXT_CHARS`` for a filter): one
   search's worst case is then ``work`` instruction-steps, whatever the pattern. Simple regexes
   (up to ~60 instructions) read a filter's whole cap; the worst ones read a few thousand
   characters. What was cut is counted (``RegexWork.cut``), and a search that found nothing in
   the start of a text it could not read whole cannot tell (None: ``not matches`` fails closed).
   ``contains`` reads the same start of a text, timed the same way.
2. **Time per trace**: a trace's filters (all its groups', every condition, its spans') share
   ``FILTER_SECONDS_PER_TRACE`` of matching. Past it, a ``matches`` condition is *unknown*: the
   group does not take the trace (fail closed: nothing is spent on traffic it may not want) and
   the trace is counted as cut by the budget. Time, not an estimate, so that ordinary regexes on
   long texts - which the DFA scans far below the worst case - are never refused; the per-search
   cap keeps one search from overshooting the budget by more than its own worst case.

So a tenant's worst filter costs that tenant's trace at most the budget plus one search, and
the live loop routes a batch in slices (``consumers.traces``) so that no other trace waits
behind more than one trace's share. Pattern members read long texts in threads, with the same
per-search rule at a larger cap (``scoring.members.patterns``).
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
