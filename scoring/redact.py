"""Cutting secrets out of text that leaves the process: member reasons and details (published in
ratings, Signals and webhook bodies), log lines, CLI output, shown URLs.

Two kinds of secret are cut: ones recognised by their shape anywhere (``redact_text``, the wire
models' rule, in scorer_groups.redaction), and ones known by value - the process's configured
secrets, whatever shape they have. Tenants' text passes through here before it is published, so
what a hostile scorer managed to read could still not leave.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from scorer_groups.redaction import REDACTED, SECRET_NAME, mask_url, redact_text

__all__ = ["REDACTED", "SECRET_NAME", "Redactor", "mask_url", "redact_text"]

_MIN_KNOWN_SECRET = 6  # shorter values would cut ordinary words


class Redactor:
    """Cuts the shapes of ``redact_text`` and the known secret values it was given."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        known = sorted({s for s in secrets if s and len(s) >= _MIN_KNOWN_SECRET}, key=len, reverse=True)
        self._known = re.compile("|".join(re.escape(s) for s in known)) if known else None

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

    def __call__(self, text: str) -> str:
        if self._known is not None:
            text = self._known.sub(REDACTED, text)
        return redact_text(text)
