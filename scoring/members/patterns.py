"""Pattern members: regexes (RE2, linear time), case-insensitive keywords and built-in templates.

A pattern answers matched / not matched; ``blend.goodness`` reads that through its polarity. Each pattern
version is compiled once (``compiled``), never per trace. The one rule: patterns are written by tenants,
so every search is bounded (``scoring.regex_work``) and long texts run off the event loop, in threads
shared fairly across projects. The bounds: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import functools
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import re2

from scoring.frozen import frozen
from scoring.members.fair_share import FairShare
from scoring.models import RE2_OPTIONS, Pattern, PatternTemplate, compile_user_regex
from scoring.re2_search import chars_before, first_match, native
from scoring.regex_work import readable_chars

MAX_TEXT_CHARS = 262_144  # of each side (input, output) that a pattern reads
# RE2's worst case for one search (instructions x characters): ~0.5 s in a thread here. Every
# built-in template (<= 246 instructions) still reads MAX_TEXT_CHARS; the largest regex a few
# tens of thousands of characters.
PATTERN_SEARCH_WORK = 1 << 26
# Up to this worst case (characters x program size), a check runs on the event loop: a few ms at
# RE2's worst, 16 KiB for a regex of 60 instructions; a keyword scan counts as one instruction.
INLINE_WORK = 16_384 * 60
INLINE_TEXT_CHARS = INLINE_WORK // 60  # for a simple regex or keywords: 16 KiB
DEADLINE_S = 5.0  # a pattern that has not answered by then could not score
# RE2 releases the GIL while it matches: these threads run beside the event loop.
THREADS = 4  # a project may hold 3 (fair_share.default_share): one is always free for another
_THREADS = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="pattern")
# The threads' fair share across projects, one per event loop (its waiters are that loop's).
_SHARES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairShare] = weakref.WeakKeyDictionary()
# Threads bound how many searches a project runs at once, not the CPU they take: three threads of
# one tenant's regex bombs on two cores held another tenant's results 3-4 s. So a project's
# searches in threads may also use at most this much CPU a second on average (a token bucket of
# ``THREAD_BURST_S``); past it, its next long search waits for its time - within the deadline.
THREAD_SECONDS_PER_S = 0.5
THREAD_BURST_S = 2.0
_BUDGETS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ThreadTime] = weakref.WeakKeyDictionary()


class ThreadTime:
    """Each project's CPU time in the pattern threads, as a token bucket: ``rate`` seconds a
    second, up to ``burst`` saved. Spent after a search by what it took (the thread's own CPU
    time), so a project over its time waits before its next search, never during one."""

    MAX_PROJECTS = 10_000  # projects tracked; past it, those with a full bucket are forgotten

    def __init__(self, rate: float = THREAD_SECONDS_PER_S, burst: float = THREAD_BURST_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._rate, self._burst, self._clock = rate, burst, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # project -> (seconds left, as of)

    def _left(self, project: str) -> float:
        left, at = self._buckets.get(project, (self._burst, self._clock()))
        return min(self._burst, left + (self._clock() - at) * self._rate)

    def wait_s(self, project: str) -> float:
        """How long the project's next search must wait for its time (0: none)."""
        left = self._left(project)
        return 0.0 if left >= 0 else -left / self._rate

    def spend(self, project: str, seconds: float) -> None:
        self._buckets[project] = (self._left(project) - seconds, self._clock())
        if len(self._buckets) > self.MAX_PROJECTS:
            self._buckets = {p: b for p, b in self._buckets.items() if self._left(p) < self._burst}


ADMITTED_S = 0.05  # charged when a search starts, so that searches let in at once see each other


def _timed(check: Callable[[str, str], PatternVerdict], input_text: str, output_text: str
           ) -> tuple[PatternVerdict | Exception, float]:
    """``check`` in a thread, with the CPU time it took there (a search that raised took it too)."""
    started = time.thread_time()
    try:
        verdict: PatternVerdict | Exception = check(input_text, output_text)
    except Exception as exc:
        verdict = exc
    return verdict, time.thread_time() - started


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum that every payment card number satisfies."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        d = ord(char) - 48
        if position % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_number(candidate: str) -> bool:
    digits = "".join(c for c in candidate if c.isdigit())
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


def _ssn(candidate: str) -> bool:
    area, group, serial = candidate.split("-")
    return area not in ("000", "666") and not area.startswith("9") and group != "00" and serial != "0000"


@dataclass(frozen=True, slots=True)
class _Template:
    regex: str
    confirm: Callable[[str], bool] | None = None  # checks each candidate the regex found


TEMPLATES: dict[PatternTemplate, _Template] = {
    "email": _Template(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}"),
    "phone": _Template(
        r"(?:\+\d{1,3}[\s.-]?)?(?:\(\d{3}\)\s?|\b\d{3}[\s.-])\d{3}[\s.-]\d{4}\b"
    ),
    "credit_card": _Template(r"\b\d(?:[ -]?\d){12,18}\b", confirm=_card_number),
    "ssn": _Template(r"\b\d{3}-\d{2}-\d{4}\b", confirm=_ssn),
    "apology": _Template(
        r"(?i)\b(?:i(?:'|’)?m (?:so |very |really )?sorry|i am (?:so |very |really )?sorry|"
        r"i apologi[sz]e|(?:my|our) apologies|sorry (?:for|about) (?:the|that|any)|"
        r"please accept (?:my|our) apolog)"
    ),
    "refusal": _Template(
        r"(?i)\b(?:i (?:can(?:no|'|’)t|am unable to|am not able to|won(?:'|’)t|must decline to)"
        r" (?:help|assist|do|provide|comply|share|answer|fulfil)|"
        r"i(?:'|’)m (?:unable|not able) to (?:help|assist|do|provide|comply|share|answer)|"
        r"as an ai(?: language model)?,? i (?:can(?:no|'|’)t|am unable|won(?:'|’)t))"
    ),
}


SCREENED_TEXTS_KEPT = 8  # texts whose screen answers are kept: a subject's sides, a few subjects'
# Searched alone: its repetition ({12,18} digits) grows the shared DFA past its cache on a text of
# digits and spaces (31 ms for 256 KiB screened with it, 0.4 ms without; its own search stops at
# the first candidate), and it confirms each candidate in Python anyway.
UNSCREENED_TEMPLATES = frozenset({"credit_card"})


class TemplateScreen:
    """Which built-in templates match a text at all, found for all of them (but
    ``UNSCREENED_TEMPLATES``) in one pass (RE2::Set), and the text's UTF-8 (what RE2 reads),
    kept for the last few texts: a trace's every pattern check across its groups encodes its
    side's text once and asks the screen once, not one search per template (~0.1 against ~1.8 us
    a check that finds nothing, the common case). A template screened out surely has no match in
    that text - the same engine and options on the very same text - so its check is skipped; one
    screened in runs its own search (an offset, a Luhn check), as without the screen.

    RE2::Set has no fallback when its DFA runs out of memory: it then reports no match at all.
    A canary pattern that matches every text, at its end only (``\\z``), tells that apart: a pass
    without it screens nothing out."""

    def __init__(self, options: re2.Options) -> None:
        self._set: re2.Set | None = re2.Set.SearchSet(options)
        self._index: dict[str, int] = {}
        try:
            for name, template in TEMPLATES.items():
                if name not in UNSCREENED_TEMPLATES:
                    self._index[name] = self._set.Add(template.regex)
            self._canary = self._set.Add(r"\z")
            self._set.Compile()
        except re2.error:  # then every check searches on its own
            self._set = None
        # id(text) -> (text, its UTF-8, the templates found or None: screened when first asked)
        self._kept: dict[int, tuple[str, bytes, frozenset[int] | None, bool]] = {}

    def _look(self, text: str, screen: bool) -> tuple[str, bytes, frozenset[int] | None, bool]:
        kept = self._kept.get(id(text))
        if kept is not None and kept[0] is text and (kept[3] or not screen):
            return kept
        encoded = kept[1] if kept is not None and kept[0] is text else text.encode()
        found: frozenset[int] | None = None
        if screen and self._set is not None:
            matches = self._set.Match(encoded)
            found = frozenset(matches) if matches is not None and self._canary in matches else None
        if len(self._kept) >= SCREENED_TEXTS_KEPT:
            self._kept.clear()
        looked = (text, encoded, found, screen)
        self._kept[id(text)] = looked  # the text kept with its id: never another's answer
        return looked

    def utf8(self, text: str) -> bytes:
        """``text`` encoded as UTF-8 (kept: the other patterns of its subject read it too)."""
        return self._look(text, False)[1]

    def absent(self, template: str, text: str) -> bool:
        """Whether ``template`` surely does not match ``text`` (False: search it)."""
        index = self._index.get(template)
        if index is None or self._set is None:
            return False
        found = self._look(text, True)[2]
        return found is not None and index not in found


SCREEN = TemplateScreen(RE2_OPTIONS)


@frozen
class PatternVerdict:
    matched: bool
    detail: str  # where it matched, never what: the match may be the PII the pattern looks for


class CompiledPattern:
    """One pattern version, ready to run on text many times."""

    def __init__(self, pattern: Pattern) -> None:
        self.target = pattern.target
        self._keywords: tuple[str, ...] = ()
        self._confirm: Callable[[str], bool] | None = None
        self._regex: re2._Regexp | None = None
        self._template = ""  # a built-in template's name: the screen may answer for it
        if pattern.regex is not None:
            self._regex = compile_user_regex(pattern.regex)
            self._what = "regex"
        elif pattern.contains is not None:
            self._keywords = tuple(k.casefold() for k in pattern.contains)
            self._what = "keyword"
        else:
            assert pattern.template is not None  # the model guarantees exactly one matcher
            template = TEMPLATES[pattern.template]
            self._template = pattern.template
            self._regex = compile_user_regex(template.regex)
            self._confirm = template.confirm
            self._what = f"template {pattern.template}"
        # How much of each side one search reads: all of MAX_TEXT_CHARS but for a large regex.
        self.reads = MAX_TEXT_CHARS if self._regex is None else readable_chars(
            self._regex, PATTERN_SEARCH_WORK, MAX_TEXT_CHARS)
        self._program = 60 if self._regex is None else max(60, int(self._regex.programsize))
        self._native: Any = None if self._regex is None else native(self._regex)
        self.no_match = PatternVerdict(False, f"{self._what} did not match the {self.target}")  # immutable: shared

    def _find(self, text: str) -> int | None:
        """The offset (in characters) of the first match in ``text``, or None."""
        if self._keywords:
            folded = text.casefold()
            offsets = [i for i in (folded.find(k) for k in self._keywords) if i >= 0]
            return min(offsets) if offsets else None
        if self._template and SCREEN.absent(self._template, text):
            return None
        encoded = SCREEN.utf8(text)
        found = first_match(self._native, encoded, self._confirm)
        return None if found is None else chars_before(encoded, found)

    def sides(self, input_text: str, output_text: str) -> tuple[tuple[str, str], ...]:
        if self.target == "output":
            return (("output", output_text),)
        if self.target == "input":
            return (("input", input_text),)
        return ("input", input_text), ("output", output_text)

    def check(self, input_text: str, output_text: str) -> PatternVerdict:
        sides = self.sides(input_text, output_text)
        for side, text in sides:
            offset = self._find(text[:self.reads])  # a short text's slice is the text itself, no copy
            if offset is not None:
                return PatternVerdict(True, f"{self._what} matched in {side} at offset {offset}")
        cut = [side for side, text in sides if len(text) > self.reads]
        if not cut:
            return self.no_match
        read = f" (read the first {self.reads} characters of the {', '.join(cut)})"
        return PatternVerdict(False, f"{self._what} did not match the {self.target}{read}")

    def short(self, input_text: str, output_text: str) -> bool:
        """Whether checking this text is quick enough to do on the event loop: its worst case
        (characters read x the regex's program) is within ``INLINE_WORK``."""
        read = sum(min(len(text), self.reads) for _, text in self.sides(input_text, output_text))
        return read * self._program <= INLINE_WORK

    async def check_off_loop(self, input_text: str, output_text: str, project: str) -> PatternVerdict:
        """``check``, in a thread when the text is long, within ``project``'s fair share of the
        threads and of their CPU time; raises TimeoutError past DEADLINE_S (waiting for its time
        and a thread included)."""
        if self.short(input_text, output_text):
            return self.check(input_text, output_text)
        loop = asyncio.get_running_loop()
        share = _SHARES.get(loop) or _SHARES.setdefault(loop, FairShare(THREADS))
        budget = _BUDGETS.get(loop) or _BUDGETS.setdefault(loop, ThreadTime())
        async with asyncio.timeout(DEADLINE_S):
            for _ in range(8):  # its time, again after each wait: others of its searches may have spent it
                wait = budget.wait_s(project)
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
            await share.acquire(project)
            budget.spend(project, ADMITTED_S)
            work = loop.run_in_executor(_THREADS, _timed, self.check, input_text, output_text)

            def done(finished: asyncio.Future[tuple[PatternVerdict | Exception, float]]) -> None:
                share.release(project)
                if not finished.cancelled() and finished.exception() is None:
                    budget.spend(project, finished.result()[1] - ADMITTED_S)

            # The thread cannot be stopped: its slot is the project's until the search ends, past
            # the deadline too (so a project's runaway searches hold its own share, no other's).
            work.add_done_callback(done)
            verdict, _ = await asyncio.shield(work)
            if isinstance(verdict, Exception):
                raise verdict
            return verdict


@functools.lru_cache(maxsize=4096)
def _compiled(pattern_json: str) -> CompiledPattern:
    return CompiledPattern(Pattern.model_validate_json(pattern_json))


# The same Pattern object (catalog snapshots are immutable) maps to its compiled form without
# serializing it again: the cache holds the object itself, so an id is never reused meanwhile.
_BY_OBJECT: dict[int, tuple[Pattern, CompiledPattern]] = {}
_BY_OBJECT_MAX = 4096


def compiled(pattern: Pattern) -> CompiledPattern:
    """The compiled form of this pattern version, built once and shared."""
    hit = _BY_OBJECT.get(id(pattern))
    if hit is not None and hit[0] is pattern:
        return hit[1]
    result = _compiled(pattern.model_dump_json())
    if len(_BY_OBJECT) >= _BY_OBJECT_MAX:
        _BY_OBJECT.clear()
    _BY_OBJECT[id(pattern)] = (pattern, result)
    return result
