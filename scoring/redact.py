"""Cutting secrets out of text that leaves the process: member reasons and details (published in
ratings, Signals and webhook bodies), log lines, CLI output, shown URLs.

Two kinds of secret are cut: ones recognised by their shape anywhere (a password inside a URL,
a bearer token, an OpenAI-style key, a ``token=`` query parameter), and ones known by value -
the process's configured secrets, whatever shape they have. Tenants' text passes through here
before it is published, so what a hostile scorer managed to read could still not leave.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

REDACTED = "[redacted]"

# Names of settings, variables and fields whose values are secrets whatever they hold.
SECRET_NAME = re.compile(
    r"(api[_-]?key|apikey|secret|password|passwd|token|authorization|signature|credential|private[_-]?key)",
    re.IGNORECASE,
)
# user:password@ or token@ inside a URL: keep the scheme and the user, drop the secret.
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<userinfo>[^/@\s?#]+)@", re.IGNORECASE)
_BEARER = re.compile(r"(bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE)
_KEY_LIKE = re.compile(r"\b(?:sk|whsec|sgw)[-_][A-Za-z0-9_-]{8,}")
# ?token=... &api_key=... in URLs and query-like text.
_SECRET_PARAM = re.compile(
    r"(?P<name>[?&;](?:[\w.-]*(?:token|key|secret|password|passwd|signature|sig|auth|credential)[\w.-]*))=[^&#\s]*",
    re.IGNORECASE,
)
_MIN_KNOWN_SECRET = 6  # shorter values would cut ordinary words


def _userinfo(match: re.Match[str]) -> str:
    user, _, password = match["userinfo"].partition(":")
    return f"{match['scheme']}{user}:{REDACTED}@" if password else f"{match['scheme']}{REDACTED}@"


def redact_text(text: str) -> str:
    """Cut secrets recognised by their shape."""
    text = _URL_USERINFO.sub(_userinfo, text)
    text = _SECRET_PARAM.sub(lambda m: f"{m['name']}={REDACTED}", text)
    text = _BEARER.sub(lambda m: m.group(1) + REDACTED, text)
    return _KEY_LIKE.sub(REDACTED, text)


def mask_url(url: str) -> str:
    """A URL as it may be shown: credentials and secret query parameters masked."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if parts.username is not None or parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{REDACTED}@{host}")
    return redact_text(urlunsplit(parts))


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
