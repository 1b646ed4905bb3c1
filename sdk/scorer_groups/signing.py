"""Standard Webhooks 1.0 signatures for alert-channel deliveries.

A receiver verifies a delivery with any Standard Webhooks library (``standardwebhooks`` on PyPI,
Svix's libraries): the three headers below and the channel's ``whsec_`` secret are all it needs.

- ``webhook-id``: the delivery's id, deterministic from the Signal and the channel, the same on
  every retry and replay, so a receiver deduplicates on it;
- ``webhook-timestamp``: when this attempt was signed, Unix seconds (receivers refuse old ones,
  so a captured request cannot be replayed later);
- ``webhook-signature``: ``v1,<base64 HMAC-SHA256 of "<id>.<timestamp>.<body>">`` keyed with the
  base64-decoded part of the secret after ``whsec_``. While a secret is being rotated, one
  signature per valid secret, space-separated: receivers holding either secret verify.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # generated secrets; the spec asks for 24 to 64
MIN_SECRET_BYTES, MAX_SECRET_BYTES = 24, 64


def new_secret() -> str:
    """A fresh channel secret in Standard Webhooks form: ``whsec_`` + base64 of random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret; ValueError (naming no secret) when it is not one."""
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"must be a Standard Webhooks secret: {SECRET_PREFIX} followed by base64 "
                         "(generate one with `scorer-worker webhooks new-secret`)")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX):], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the part after {SECRET_PREFIX} must be valid base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(f"must decode to {MIN_SECRET_BYTES}-{MAX_SECRET_BYTES} bytes, got {len(key)}")
    return key


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of ``<id>.<timestamp>.<body>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(msg_id: str, timestamp: int, body: bytes, secrets_: Iterable[str]) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt; no signature header without a secret."""
    out = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    signatures = [sign(s, msg_id, timestamp, body) for s in secrets_]
    if signatures:
        out["webhook-signature"] = " ".join(signatures)
    return out
