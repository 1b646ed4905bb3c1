"""Backfill jobs, the parts that do no I/O, shared by both clients and the CLI
(``scorer-worker backfill``): the window's ends - an aware ``datetime``, an ISO time with its
zone, or a duration back from now ("90m", "24h", "7d") - the request's body, and the progress
line a job draws while it is waited on. The calls are the clients' (``_async``, and ``_sync``
generated from it)."""

from __future__ import annotations

import re
import sys
import time
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from scorer_groups._progress import Line, bar
from scorer_groups.api_models import BACKFILL_ENDED, BackfillJob

When = datetime | str  # an aware datetime, an ISO time with a zone, or a duration back from now

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3_600, "d": 86_400}


def parse_duration(text: str) -> timedelta:
    """'90m', '24h', '7d' (and seconds, '30s'; decimals, '1.5h')."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"{text.strip()!r} is not a duration like 90m, 24h or 7d")
    return timedelta(seconds=float(match[1]) * _UNIT_S[match[2]])


def parse_when(value: When, now: datetime) -> datetime:
    """A duration as ``now`` minus it; an ISO time or a datetime as it is, if it has a zone. One
    without is refused rather than guessed: the server compares it with its own clock."""
    if isinstance(value, str):
        text = value.strip()
        try:
            return now - parse_duration(text)
        except ValueError:
            pass
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{text!r} is neither a duration (90m, 24h, 7d) nor an ISO time") from None
    if value.utcoffset() is None:
        raise ValueError(f"{value.isoformat()} has no time zone: give one (Z, +02:00) or a duration back from now")
    return value


def backfill_body(since: When, until: When | None = None, sample_rate: float | None = None,
                  max_judge_calls: int | None = None, alerts: bool = False,
                  now: datetime | None = None) -> dict[str, Any]:
    """The body of ``POST /v1/scorer-groups/{id}/backfills``: the window ``[since, until)``,
    ``until`` now by default. Both ends are read against the same ``now``, so ``since="24h"`` is a
    window of 24 hours exactly. What the group allows is the server's to check (it names the field)."""
    now = now or datetime.now(UTC)
    end = now if until is None else parse_when(until, now)
    body: dict[str, Any] = {"from": parse_when(since, now).isoformat(), "to": end.isoformat(), "alerts": alerts}
    if sample_rate is not None:  # unsent: the group's own online sampleRate
        body["sampleRate"] = sample_rate
    if max_judge_calls is not None:
        body["maxJudgeCalls"] = max_judge_calls
    return body


def progress_line(job: BackfillJob, tz: tzinfo | None = None, now: datetime | None = None) -> str:
    """The bar, the fraction read and the counts; a job that is not running also says its status
    (a paused one, until when: in ``tz``, local time by default; with the date when not today)."""
    p = job.progress
    parts = [bar(p.fraction), f"{p.fraction:4.0%}", f"{p.traces_read:,} traces read",
             f"{p.pairs_scored:,} pairs scored"]
    if p.pairs_skipped:
        parts.append(f"{p.pairs_skipped:,} skipped")
    if job.status == "paused" and job.resume_at is not None:
        parts.append(f"paused until {_clock(job.resume_at, tz, now)}")
    elif job.status != "running":
        parts.append(job.status)
    return "  ".join(parts)


def _clock(when: datetime, tz: tzinfo | None, now: datetime | None) -> str:
    local = when.astimezone(tz)
    today = (now or datetime.now(UTC)).astimezone(tz).date()
    return local.strftime("%H:%M" if local.date() == today else "%Y-%m-%d %H:%M")


class BackfillBar:
    """A job's progress line on stderr while it is waited on (``_progress.Line``): when ``shown``
    - None: when stderr is a terminal. The line ends once the job has (or the wait gave up, ``last``)."""

    def __init__(self, shown: bool | None) -> None:
        self._line = Line(sys.stderr.isatty() if shown is None else shown)

    def draw(self, job: BackfillJob, *, last: bool = False) -> None:
        self._line.draw(progress_line(job), last=last or job.status in BACKFILL_ENDED)


class Deadline:
    """``timeout_s`` from now (None: never), on the monotonic clock. Here rather than in the
    clients' source: the generated sync client gets ``time`` only as its rename of ``asyncio``."""

    def __init__(self, timeout_s: float | None) -> None:
        self._at = None if timeout_s is None else time.monotonic() + timeout_s

    def passed(self) -> bool:
        return self._at is not None and time.monotonic() >= self._at

    def nap(self, poll_s: float) -> float:
        """How long to sleep before the next poll: ``poll_s``, or less to wake at the deadline."""
        return poll_s if self._at is None else max(0.0, min(poll_s, self._at - time.monotonic()))
