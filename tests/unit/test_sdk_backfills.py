"""The SDK's backfill parts that do no I/O: a window's ends from durations and ISO
times, the request's body, and the progress line a job draws while it is waited on (the CLI's
``backfill --follow`` draws the same)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from scorer_groups.api_models import BackfillJob
from scorer_groups.backfills import BackfillBar, Deadline, backfill_body, parse_duration, parse_when, progress_line

NOW = datetime(2026, 3, 4, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "seconds"), [
    ("90m", 5_400), ("24h", 86_400), ("7d", 604_800), ("30s", 30), ("1.5h", 5_400), (" 2h ", 7_200)])
def test_a_duration_is_a_number_and_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "7", "h", "-1h", "1w", "2 hours", "1h30m"])
def test_anything_else_is_not_a_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration like 90m, 24h or 7d"):
        parse_duration(text)


def test_a_time_is_a_duration_back_from_now_an_iso_time_or_a_datetime_with_a_zone() -> None:
    assert parse_when("24h", NOW) == NOW - timedelta(hours=24)
    assert parse_when("2026-03-01T08:00:00Z", NOW) == datetime(2026, 3, 1, 8, tzinfo=UTC)
    paris = datetime(2026, 3, 1, 9, tzinfo=timezone(timedelta(hours=1)))
    assert parse_when(paris, NOW) is paris, "an aware datetime as it is"
    assert parse_when("2026-03-01T09:00:00+01:00", NOW) == paris


@pytest.mark.parametrize(("value", "why"), [
    (datetime(2026, 3, 1, 8), "has no time zone"),  # whose 08:00? the server's clock is UTC, the caller's may not be
    ("2026-03-01T08:00:00", "has no time zone"),
    ("yesterday", "is neither a duration (90m, 24h, 7d) nor an ISO time"),
])
def test_a_time_without_a_zone_or_that_is_no_time_is_refused(value: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        parse_when(value, NOW)


def test_the_body_ends_now_by_default_and_sends_only_what_is_given() -> None:
    assert backfill_body("24h", now=NOW) == {
        "from": "2026-03-03T12:00:00+00:00", "to": "2026-03-04T12:00:00+00:00", "alerts": False}, \
        "both ends against one now: a window of 24 hours exactly; the sample is the group's"
    assert backfill_body(NOW - timedelta(days=7), "1h", sample_rate=0.5, max_judge_calls=200, alerts=True,
                         now=NOW) == {"from": "2026-02-25T12:00:00+00:00", "to": "2026-03-04T11:00:00+00:00",
                                      "alerts": True, "sampleRate": 0.5, "maxJudgeCalls": 200}


def job(status: str = "running", fraction: float = 0.0, **fields: Any) -> BackfillJob:
    counts = {k: fields.pop(k) for k in ("traces_read", "pairs_scored", "pairs_skipped") if k in fields}
    return BackfillJob.model_validate({
        "id": "bf-0123456789abcdef", "groupId": "g", "projectId": "p", "status": status,
        "from": "2026-03-03T12:00:00Z", "to": "2026-03-04T12:00:00Z", "sampleRate": 1.0,
        "progress": {"fraction": fraction, **counts}, "createdAt": NOW, "updatedAt": NOW, **fields})


def test_the_line_shows_the_fraction_the_traces_read_and_the_pairs_scored() -> None:
    line = progress_line(job(fraction=0.31, traces_read=1234, pairs_scored=56))
    assert line == "[#########.....................]   31%  1,234 traces read  56 pairs scored", \
        "the dataset runs' bar (9 of 30 filled); a running job says no status"
    assert progress_line(job(fraction=1.0, pairs_skipped=3, status="done")).startswith(f"[{'#' * 30}]  100%")
    assert progress_line(job(pairs_skipped=3)).endswith("0 pairs scored  3 skipped"), "skipped: only when some were"


@pytest.mark.parametrize("status", ["queued", "done", "failed", "cancelled", "paused"])
def test_a_job_that_is_not_running_says_its_status(status: str) -> None:
    assert progress_line(job(status)).endswith(f"pairs scored  {status}")


def test_a_paused_job_says_until_when() -> None:
    paused = job("paused", 0.5, resumeAt="2026-03-04T13:00:00Z")
    assert progress_line(paused, UTC, NOW).endswith("pairs scored  paused until 13:00")
    plus_two = timezone(timedelta(hours=2))
    assert progress_line(paused, plus_two, NOW).endswith("paused until 15:00"), "in the reader's zone"
    later = job("paused", resumeAt="2026-03-06T00:00:00Z")
    assert progress_line(later, UTC, NOW).endswith("paused until 2026-03-06 00:00"), "another day: with its date"


def test_the_bar_is_drawn_in_place_when_shown_and_ends_with_the_job(capsys: pytest.CaptureFixture[str]) -> None:
    bar = BackfillBar(True)
    bar.draw(job("paused", 0.5, resumeAt="2026-03-04T13:00:00Z"))
    bar.draw(job(fraction=0.6))
    bar.draw(job("cancelled", 0.6))
    drawn = capsys.readouterr().err
    lines = drawn.split("\r")[1:]
    assert len(lines) == 3 and drawn.endswith("cancelled\n") and "\n" not in "".join(lines[:2])
    assert len(lines[1]) == len(lines[0]) and lines[1].endswith(" "), \
        "a shorter line is padded over the longer one it replaces"
    hidden = BackfillBar(False)
    hidden.draw(job("done", 1.0))
    assert capsys.readouterr().err == "", "nothing on a pipe: a CI log stays clean"


def test_a_deadline_bounds_the_naps() -> None:
    never = Deadline(None)
    assert not never.passed() and never.nap(1.0) == 1.0
    now = Deadline(0)
    assert now.passed() and now.nap(1.0) == 0.0
    later = Deadline(60)
    assert not later.passed() and later.nap(1.0) == 1.0 and later.nap(120) <= 60
