"""Cutting secrets out of text that leaves the process: reasons, judge call records, logs, CLI output.

Two kinds: secrets by shape anywhere (``redact_text``) and the process's known secrets by value
(``Redactor``). The one rule: text a tenant can steer is cut of shapes only, since masking a known value
would tell a guessing tenant which guess came back. Which text meets which: docs/design-notes.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from scorer_groups.redaction import REDACTED, SECRET_NAME, mask_url, redact_text

__all__ = ["REDACTED", "SECRET_NAME", "Redactor", "mask_url", "redact_text"]

_MIN_KNOWN_SECRET = 6  # shorter values would cut ordinary words


def _alternation(values: Iterable[str]) -> re.Pattern[str] | None:
    ordered = sorted(values, key=len, reverse=True)  # the longest first: a secret holding another is cut whole
    return re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None


class Redactor:
    """Cuts the shapes of ``redact_text`` and the known secret values it was given."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._values = frozenset(s for s in secrets if s and len(s) >= _MIN_KNOWN_SECRET)
        self._known = _alternation(self._values)

    @classmethod
    def from_environment(cls, extra: Iterable[str] = ()) -> Redactor:
        """Known secrets: ``extra`` plus the values of environment variables named like secrets
        and the passwords inside URL-valued variables."""
        values = list(extra)
        for name, value in os.environ.items():
            if SECRET_NAME.search(name):
                values.append(value)
            elif "://" in value:
                try:
                    password = urlsplit(value).password
                except ValueError:
                    password = None
                if password:
                    values.append(password)
        return cls(values)

    def __call__(self, text: str, *, tenant_gave: Iterable[str] = ()) -> str:
        """``text`` cut of shapes and known values - but for the values found in ``tenant_gave``
        (what the tenant sent in the exchange ``text`` tells of): their echo answers no guess."""
        known = self._known
        if self._values and tenant_gave:
            given = tuple(tenant_gave)
            echoed = {s for s in self._values if any(s in g for g in given)}
            if echoed:  # rare: only a tenant that holds (or guessed) a secret gets here
                known = _alternation(self._values - echoed)
        if known is not None:
            text = known.sub(REDACTED, text)
        return redact_text(text)
