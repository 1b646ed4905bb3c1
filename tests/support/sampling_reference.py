"""The sampling contract, written from its definition and independently of ``scoring.sampling``:
a subject's point is the first 8 bytes of blake2b of the subject (then 0x1f and the group's
``sampleSalt``, when it sets one), big-endian, its top 53 bits over 2^53; it is kept below the rate.
Tests compute their expectations with this, never with the code they check."""

from __future__ import annotations

import hashlib


def reference_point(subject: str, salt: str = "") -> float:
    data = subject.encode() + (b"\x1f" + salt.encode() if salt else b"")
    return (int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big") >> 11) / float(1 << 53)


def reference_keep(subject: str, rate: float, salt: str = "") -> bool:
    return rate >= 1 or (rate > 0 and reference_point(subject, salt) < rate)
