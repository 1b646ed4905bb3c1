"""Sampling: a stable keep-or-skip decision per (subject, group) - and the same one for every
group at the same rate.

The keep point of a subject (a trace, a span or a conversation) depends on the subject alone:
two groups at 20% keep the same fifth of the traffic, so an old and a new rubric run side by
side are compared trace by trace, and a group at 10% keeps a subset of what one at 20% keeps
(nested samples). A group that wants a sample of its own sets ``online.sampleSalt``: different
salts give independent samples. A salt equal to the group's id gives the sample every group had
before consistent sampling (the point of the pair (subject, group)), for a team that must not
see its sample shift on upgrade.

The point hashes its inputs, so every process, every restart, every replay of a trace and every
sweep tick over a session decides the same way. Python's ``hash`` is salted per process and
would not; blake2b is stable and uniform.
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
