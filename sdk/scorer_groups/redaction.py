"""Secrets recognised by their shape, cut out of text that is shown: a password inside a URL,
a bearer token, an OpenAI-style key, a ``token=`` query parameter. Documents show their URLs
through ``mask_url``; the server's ``Redactor`` (scoring.redact) adds the secrets it knows by
value. Standard library only.
"""

from __future__ import annotations

import re
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


def _userinfo(match: re.Match[str]) -> str:
    user, _, password = match["userinfo"].partition(":")
    return f"{match['scheme']}{user}:{REDACTED}@" if password else f"{match['scheme']}{REDACTED}@"


def redact_text(text: str) -> str:
    """Cut secrets recognised by their shape. Each shape is looked for only when the text holds
    its one required piece ("://", "=") - a substring test is ~100 times cheaper than the scan,
    and judge prompts (kept with every result) are mostly prose."""
    if "://" in text:
        text = _URL_USERINFO.sub(_userinfo, text)
    if "=" in text:
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
