"""RE2 searched on UTF-8 itself, under the ``re2`` module's str API.

The ``re2`` module's ``search`` on a str costs ~2-4 us in Python (the text encoded, a generator,
offset maps, a match object) around ~1 us of RE2's own matching. Where a text is searched many
times (a subject's side, by every pattern of its groups), or only whether it matches is asked (a
filter), the text is encoded once and RE2 searched on those bytes directly: the same engine,
program and options on the same bytes the wrapper would pass it - so the same matches - and only
a match's offset turned back into characters (``chars_before``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import re2

UNANCHORED = re2._Anchor.UNANCHORED
_CHARS_IN = re2._re2.BytesToCharLen  # (utf8, from, to): the characters in utf8[from:to]
_BYTES_IN = re2._re2.CharLenToBytes  # (utf8, from, chars): the bytes of the next ``chars`` characters


def native(regex: re2._Regexp) -> Any:
    """The compiled RE2 under a regex compiled from a str (its program reads UTF-8)."""
    return regex._regexp


def first_match(program: Any, encoded: bytes, confirm: Callable[[str], bool] | None = None) -> int | None:
    """The byte offset of the first match of ``program`` (``native``) in ``encoded`` (UTF-8)
    that ``confirm`` accepts (any, without one), or None. Each search starts where the last
    candidate ended (RE2 still reads the text before it for ``\\b``), as ``re2.finditer`` does
    for candidates on character boundaries - every template's (``\\C`` can split a character,
    where the wrapper's own offsets drift)."""
    position, end = 0, len(encoded)
    while position <= end:
        start, stop = program.Match(UNANCHORED, encoded, position, end)[0]
        if start < 0:
            return None
        if confirm is None or confirm(encoded[start:stop].decode()):
            return int(start)
        # An empty candidate moves on by one character (never into the middle of one).
        position = stop if stop > start else stop + max(1, int(_BYTES_IN(encoded, stop, 1)))
    return None


def chars_before(encoded: bytes, offset: int) -> int:
    """How many characters the UTF-8 ``encoded`` holds before byte ``offset``."""
    return int(_CHARS_IN(encoded, 0, offset))


def matches(regex: re2._Regexp, text: str) -> bool:
    """Whether ``regex`` matches anywhere in ``text`` (``regex.search(text) is not None``)."""
    encoded = text.encode()
    return bool(native(regex).Match(UNANCHORED, encoded, 0, len(encoded))[0][0] >= 0)
