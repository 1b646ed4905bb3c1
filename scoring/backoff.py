"""Waiting before trying again, for every retry in the product: one exponential backoff with
jitter, and the wait an HTTP answer's ``Retry-After`` names. Member calls (``adapters.members.http``)
and the outage guard (``consumers.outage``) wait by ``exponential``; webhook deliveries keep a
durable schedule of the operator's waits (``scoring.webhooks.retries``) and, like member calls,
honour ``Retry-After``."""

from __future__ import annotations

import email.utils
import random
import time


def exponential(attempt: int, first_s: float, cap_s: float, floor: float = 0.0) -> float:
    """The wait before retry ``attempt`` (0: the first): ``first_s`` doubled each attempt, at most
    ``cap_s``, drawn from ``floor`` of that to all of it - jitter, so that many workers that
    failed at the same moment do not retry in step (``floor`` 0: "full jitter")."""
    ceiling = min(cap_s, first_s * 2 ** min(attempt, 64))  # past 64 doublings only the cap is left
    return random.uniform(floor * ceiling, ceiling)


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds from now: a number of seconds or an HTTP date; None when absent
    or unreadable. Never negative."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())
