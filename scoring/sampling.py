"""Sampling: a stable keep-or-skip decision per (subject, group).

The decision hashes the pair, so every process, every restart, every replay of a trace and
every sweep tick over a session decides the same way. Python's ``hash`` is salted per process
and would not; blake2b is stable and uniform.
"""

from __future__ import annotations

import hashlib

_TWO_TO_53 = float(1 << 53)


def sample_point(subject_id: str, group_id: str) -> float:
    """Where (subject, group) falls in [0, 1): the first 8 bytes of blake2b, as a fraction.

    Only the top 53 bits are used: a float holds no more, and rounding all 64 could give 1.0."""
    digest = hashlib.blake2b(
        subject_id.encode() + b"\x1f" + group_id.encode(), digest_size=8
    ).digest()
    return (int.from_bytes(digest) >> 11) / _TWO_TO_53  # big-endian, the default


def keep(subject_id: str, group_id: str, sample_rate: float) -> bool:
    """Keep the subject for the group? Exact at 0 (never) and 1 (always), as the point lies in
    [0, 1): so those two need no hash."""
    if sample_rate >= 1.0:
        return True
    if sample_rate <= 0.0:
        return False
    return sample_point(subject_id, group_id) < sample_rate
