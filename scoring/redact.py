"""Cutting secrets out of text that leaves the process: member reasons and details (published in
ratings, Signals and webhook bodies), judge call records, log lines, CLI output, shown URLs.

Two kinds of secret are cut: ones recognised by their shape anywhere (``redact_text``, the wire
models' rule, in scorer_groups.redaction), and ones known by value - the process's configured
secrets, whatever shape they have (``Redactor``).

Which text meets the known values is decided by where it came from, because masking a known value
answers a question: a tenant who gets text of its choosing echoed back - a row output of a
thousand guesses, a judge told to repeat them - sees which guess came back ``[redacted]``. So:

- Text a tenant can steer is cut of shapes only (``redact_text``): traces, dataset rows and the
  prompts built of them, a judge's answer and reason (the model is told only what the tenant
  wrote, so it can say no secret of ours - only what the tenant had it say or spell), and what a
  code scorer or the tenant's external scorer says. A hostile scorer that did read a secret would
  spell it out of an exact match anyway; the sandbox and the egress guard keep secrets out of its
  reach, not this.
- Text the server's side writes - its clients' errors, the operator's judge endpoint's error
  messages (which may echo its key or headers) - is cut of known values too, except those the
  tenant itself gave in the same exchange (``tenant_gave``): an endpoint that echoes the model name
  or the prompt it was sent, or an error that quotes the judge's answer, must not single out the
  guess that is right. A value found in what the tenant gave was the tenant's already.
- Text only the operator reads (logs, CLI output) is cut of both, whatever its origin.
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
