"""The incident core, on a driven clock: a window's verdict per reason, the watch's
open and resolve (once each, a whole window after the opening), and drift against a learned
level that a fixed threshold would have missed."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError

from scoring.incidents import (
    AGREEMENT_MIN_ITEMS,
    MIN_LEARNED,
    Baseline,
    JudgeAgreement,
    Watch,
    WindowStats,
    agreement_verdict,
    reasons,
    step,
    verdict,
)
from scoring.models import OnlineProfile

WINDOW_S = 900


def profile(**alerts: Any) -> OnlineProfile:
    return OnlineProfile.model_validate({"enabled": True, "sampleRate": 1, "alertThreshold": 6, "severity": "high",
                                         **alerts})


def stats(scores: list[float], no_score: int = 0, skipped: int = 0) -> WindowStats:
    return WindowStats(results=len(scores) + no_score, scored=len(scores), total=sum(scores), no_score=no_score,
                       skipped=skipped)


def test_the_reasons_watched_follow_the_profile() -> None:
    assert reasons(profile()) == []
    assert reasons(profile(alertMode="window")) == ["window_below"]
    assert reasons(profile(alertMode="drift", alertNoScoreRate=0.2)) == ["drift", "coverage"]
    assert reasons(profile(alertMinAgreement=0.5)) == ["agreement"]


def test_agreement_is_judged_on_judges_with_enough_labelled_items_and_any_one_under_the_floor_is_bad() -> None:
    p = profile(alertMinAgreement=0.5)
    enough, few = AGREEMENT_MIN_ITEMS, AGREEMENT_MIN_ITEMS - 1
    assert agreement_verdict(p, [JudgeAgreement("a", "A", 0.1, few)]) == "unknown", "too few labelled items"
    assert agreement_verdict(p, [JudgeAgreement("a", "A", None, enough)]) == "unknown", "no figure (all alike)"
    assert agreement_verdict(p, [JudgeAgreement("a", "A", 0.9, enough), JudgeAgreement("b", "B", 0.49, enough)]) == "bad"
    assert agreement_verdict(p, [JudgeAgreement("a", "A", 0.5, enough), JudgeAgreement("b", "B", -1.0, few)]) == "good"
    assert agreement_verdict(profile(), [JudgeAgreement("a", "A", -1.0, enough)]) == "unknown", "not watched"


def test_a_watch_remembers_when_it_last_moved() -> None:
    opened = step(Watch(), "bad", 100.0, 0, "i-1")
    assert opened is not None and opened.watch.since == 100.0
    resolved = step(opened.watch, "good", 160.0, 0, "i-1")
    assert resolved is not None and resolved.watch.since == 160.0 and resolved.watch.incident_id is None


def test_a_window_below_the_threshold_opens_once_and_resolves_a_whole_window_later() -> None:
    p = profile(alertMode="window", alertMinResults=10, alertResolveAbove=7)
    watch, events = Watch(), []
    timeline = [(0, stats([4.0] * 9)),  # below, but too few results: nothing
                (60, stats([4.0] * 10)),  # opens
                (120, stats([3.0] * 30)),  # still below: no second opening
                (500, stats([6.5] * 30)),  # at the threshold, under resolveAbove: still open
                (60 + WINDOW_S - 1, stats([9.0] * 4)),  # good, but too few results to say so
                (700, stats([8.0] * 30)),  # good, but the window still reaches back before the opening
                (60 + WINDOW_S, stats([8.0] * 30))]  # good, a whole window after: resolves
    for now, window in timeline:
        moved = step(watch, verdict("window_below", p, window), now, WINDOW_S, f"inc-{now}")
        if moved is not None:
            watch = moved.watch
            events.append((moved.state, moved.incident_id, now))
    assert events == [("opened", "inc-60", 60), ("resolved", "inc-60", 60 + WINDOW_S)]
    assert watch.incident_id is None and watch.version == 2


def test_coverage_opens_on_the_share_without_a_score_budget_skips_included() -> None:
    p = profile(alertNoScoreRate=0.2, alertMinResults=10)
    assert verdict("coverage", p, stats([8.0] * 9, no_score=1)) == "good"  # 1 of 10: well within the rate
    assert verdict("coverage", p, stats([8.0] * 8, no_score=1, skipped=1)) == "unknown", "at the rate: no flapping"
    assert verdict("coverage", p, stats([8.0] * 7, no_score=1, skipped=2)) == "bad"  # 3 of 10
    assert verdict("coverage", p, stats([], no_score=3)) == "unknown", "too few to open"
    assert verdict("coverage", p, stats([])) == "unknown", "nothing seen"


def test_drift_opens_on_a_drop_from_the_learned_level_that_the_threshold_misses_and_resolves() -> None:
    p = profile(alertMode="drift", alertMinResults=10)  # alertThreshold 6: a drop to 7 never crosses it
    rng = random.Random(7)
    level = Baseline()
    for window in range(4 * 96):  # four days of 15-minute windows around 8.5
        level = level.learn(window, 8.5 + rng.gauss(0, 0.15), WINDOW_S)
    assert abs(level.mean - 8.5) < 0.1 and level.learned >= MIN_LEARNED
    drop = stats([7.0] * 40)
    assert verdict("window_below", profile(alertMode="window"), drop) == "good", "the fixed threshold misses it"
    assert verdict("drift", p, drop, level) == "bad"
    assert verdict("drift", p, stats([8.4] * 40), level) == "good", "back within a standard deviation"
    assert verdict("drift", p, stats([7.9] * 40), level) == "unknown", "neither: an open incident stays open"
    assert verdict("drift", p, drop, Baseline(8.5, 0.01, MIN_LEARNED - 1, 0)) == "unknown", "no level yet"


def test_the_level_weighs_the_last_day_half_and_learns_each_window_once() -> None:
    level = Baseline()
    for window in range(4 * 96):  # four days at 8.0 (the first windows average; then the decay)
        level = level.learn(window, 8.0, WINDOW_S)
    assert level.learn(4 * 96 - 1, 2.0, WINDOW_S) == level, "a window is learned once"
    for window in range(4 * 96, 5 * 96):  # a day at 6.0
        level = level.learn(window, 6.0, WINDOW_S)
    assert level.mean == pytest.approx(7.0, abs=0.05), "after a day, the old level weighs half"


@pytest.mark.parametrize(("alerts", "field"), [
    ({"alertMode": "window", "alertThreshold": None}, "alertThreshold"),
    ({"alertResolveAbove": 5}, "alertResolveAbove"),
    ({"alertWindowSeconds": 59}, "alertWindowSeconds"),
    ({"alertWindowSeconds": 86_401}, "alertWindowSeconds"),
    ({"alertNoScoreRate": 1.5}, "alertNoScoreRate"),
    ({"alertDriftSigma": 0}, "alertDriftSigma"),
    ({"alertMode": "sometimes"}, "alertMode"),
])
def test_alert_settings_are_refused_naming_the_field(alerts: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        profile(**alerts)
    assert [e["loc"][-1] for e in refused.value.errors()] == [field]
