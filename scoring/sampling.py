"""Sampling: a stable keep-or-skip decision per (subject, group), the same for every group at the same rate.

The keep point depends on the subject alone (nested samples), unless a group sets ``online.sampleSalt``.
The one rule: the point is a stable hash (blake2b, never Python's salted ``hash``), so every process,
restart and replay decides the same way. Why: docs/design-notes.md.
"""

from __future__ import annotations

import hashlib

_TWO_TO_53 = float(1 << 53)
_SEPARATOR = b"\x1f"  # between the subject and a salt: ("ab", "c") and ("a", "bc") differ


def sample_point(subject_id: str, salt: str = "") -> float:
    """Where the subject falls in [0, 1): the first 8 bytes of blake2b of the subject (and the
    salt, if any), as a fraction. Only the top 53 bits are used: a float holds no more, and
    rounding all 64 could give 1.0."""
    data = subject_id.encode() + _SEPARATOR + salt.encode() if salt else subject_id.encode()
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return (int.from_bytes(digest) >> 11) / _TWO_TO_53  # big-endian, the default


def keep(subject_id: str, sample_rate: float, salt: str = "") -> bool:
    """Keep the subject at this rate (and salt)? Exact at 0 (never) and 1 (always), as the point
    lies in [0, 1): so those two need no hash."""
    if sample_rate >= 1.0:
        return True
    if sample_rate <= 0.0:
        return False
    return sample_point(subject_id, salt) < sample_rate
