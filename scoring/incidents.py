"""Incidents: when a group's level, not one result, needs a person.

Pure: the watcher (``consumers.incidents``) reads the counts and keeps each watch's state; everything it
decides is decided here, on a clock it is given. The one rule: an incident resolves on a whole good window
after its opening, never on one good result, and the level learns nothing while a drift incident is open.
The reasons, the resolution and the level: docs/design-notes.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from scorer_groups.documents import INCIDENT_EVENTS, IncidentReason, IncidentState
from scoring.frozen import frozen
from scoring.models import AlertChannel, OnlineProfile, ScorerGroup
from scoring.results import Signal, WebhookDelivery, delivery, derived_id, group_signal, signal_key

Verdict = Literal["bad", "good", "unknown"]

MIN_LEARNED = 8  # windows a level is learned from before drift is judged against it
MIN_SPREAD = 0.25  # the least standard deviation a level is judged with (0-10 scale): a group
# whose every window scored alike would otherwise alert on any wobble
HALF_LIFE_S = 86_400  # a window a day old weighs half as much in the level
COVERAGE_RESOLVE = 0.8  # coverage resolves at a share this far under the rate: no flapping at the rate
AGREEMENT_WINDOW = 50  # the newest labelled (done) review items an agreement watch judges
AGREEMENT_MIN_ITEMS = 10  # items a judge needs in that window before its agreement is judged


@frozen
class WindowStats:
    """The counts of one window of a group's results (``adapters.stores.ratings`` buckets)."""

    results: int  # results, with or without a score
    scored: int
    total: float  # the sum of the scores
    no_score: int
    skipped: int  # sampled in, not scored for want of judge budget
    below: int = 0  # scored below the alert threshold

    @property
    def mean(self) -> float | None:
        return self.total / self.scored if self.scored else None

    @property
    def unscored_share(self) -> float | None:
        seen = self.results + self.skipped
        return (self.no_score + self.skipped) / seen if seen else None


@frozen
class Baseline:
    """A group's learned level: an exponentially weighted mean and variance of its window means."""

    mean: float = 0.0
    variance: float = 0.0
    learned: int = 0  # windows learned
    last_window: int = -1  # the index (start // window) of the last window learned

    @property
    def spread(self) -> float:
        return max(math.sqrt(self.variance), MIN_SPREAD)

    def learn(self, window: int, mean: float, window_s: int) -> Baseline:
        if window <= self.last_window:
            return self
        if not self.learned:
            return Baseline(mean, 0.0, 1, window)
        alpha = 1 - 0.5 ** (window_s / HALF_LIFE_S)
        alpha = max(alpha, 1 / (self.learned + 1))  # the first windows count fully, then the decay takes over
        delta = mean - self.mean
        new_mean = self.mean + alpha * delta
        variance = (1 - alpha) * (self.variance + alpha * delta * delta)
        return Baseline(new_mean, variance, self.learned + 1, window)


@frozen
class JudgeAgreement:
    """One judge member against people over a window of labelled items (``scoring.review_agreement``)."""

    ref_id: str
    label: str
    spearman: float | None
    items: int  # the window's items the judge gave a verdict on

    @property
    def judged(self) -> bool:
        return self.spearman is not None and self.items >= AGREEMENT_MIN_ITEMS


@frozen
class Watch:
    """One reason's watch of one group: its open incident, if any."""

    incident_id: str | None = None  # the open incident
    opened_at: float | None = None
    version: int = 0  # bumped by every transition: the store moves a watch only from the version read
    since: float | None = None  # when it last moved: an agreement watch judges the labels given since


@frozen
class Transition:
    watch: Watch  # the watch after
    state: IncidentState
    incident_id: str
    at: float


def reasons(profile: OnlineProfile) -> list[IncidentReason]:
    """The reasons a group's incidents may open for."""
    watched: list[IncidentReason] = []
    if profile.alert_mode == "window":
        watched.append("window_below")
    if profile.alert_mode == "drift":
        watched.append("drift")
    if profile.alert_no_score_rate is not None:
        watched.append("coverage")
    if profile.alert_min_agreement is not None:
        watched.append("agreement")
    return watched


def verdict(reason: IncidentReason, profile: OnlineProfile, stats: WindowStats,
            baseline: Baseline | None = None) -> Verdict:
    """Is the window bad (an incident may open), good (an open one may resolve), or neither?"""
    mean, enough = stats.mean, stats.results + stats.skipped >= profile.alert_min_results
    if reason == "coverage":
        share, rate = stats.unscored_share, profile.alert_no_score_rate
        if share is None or rate is None:
            return "unknown"
        if share > rate and enough:
            return "bad"
        return "good" if share <= rate * COVERAGE_RESOLVE and enough else "unknown"
    if mean is None:
        return "unknown"
    enough = stats.scored >= profile.alert_min_results
    if reason == "window_below":
        threshold = profile.alert_threshold
        if threshold is None:
            return "unknown"
        resolve_at = profile.alert_resolve_above if profile.alert_resolve_above is not None else threshold
        return "bad" if mean < threshold and enough else "good" if mean >= resolve_at and enough else "unknown"
    if baseline is None or baseline.learned < MIN_LEARNED:
        return "unknown"  # drift: no level learned yet
    if mean < baseline.mean - profile.alert_drift_sigma * baseline.spread and enough:
        return "bad"
    return "good" if mean >= baseline.mean - baseline.spread and enough else "unknown"


def agreement_verdict(profile: OnlineProfile, judges: Sequence[JudgeAgreement]) -> Verdict:
    """The agreement watch's verdict on a window of labelled items: bad when a judge judged on
    enough of them agrees under ``alertMinAgreement``, good when every such judge is at or above
    it (and there is one)."""
    floor, judged = profile.alert_min_agreement, [j for j in judges if j.judged]
    if floor is None or not judged:
        return "unknown"
    return "bad" if any(j.spearman is not None and j.spearman < floor for j in judged) else "good"


def step(watch: Watch, judged: Verdict, now: float, window_s: int, incident_id: str) -> Transition | None:
    """What the window's verdict does to the watch: open an incident (``incident_id``), resolve
    the open one once a window wholly after its opening is good, or nothing."""
    if watch.incident_id is None:
        if judged != "bad":
            return None
        opened = Watch(incident_id, now, watch.version + 1, since=now)
        return Transition(opened, "opened", incident_id, now)
    assert watch.opened_at is not None
    if judged == "good" and now - watch.opened_at >= window_s:
        return Transition(Watch(version=watch.version + 1, since=now), "resolved", watch.incident_id, now)
    return None


# --- What an incident says (the Signal and its deliveries) ----------------------------------------

def incident_id(group_id: str, reason: IncidentReason, version: int) -> str:
    """The incident a watch opens from ``version``: every worker that decides the same opening
    names it alike (ids are derived, as every published id is)."""
    return derived_id(f"incident:{group_id}:{reason}:{version}")


def describe(reason: IncidentReason, state: IncidentState, profile: OnlineProfile, stats: WindowStats,
             baseline: Baseline | None, window_s: int, judges: Sequence[JudgeAgreement] = ()) -> str:
    """One sentence a person reads: what the window showed, against what."""
    if reason == "agreement":
        figures = ", ".join(f"{j.label} {j.spearman:.2f} over {j.items} items" for j in judges if j.judged)
        return (f"{'Opened' if state == 'opened' else 'Resolved'}: the judges' agreement with people (Spearman, "
                f"the last labelled review items) is {figures or 'not judged'}; alertMinAgreement "
                f"{profile.alert_min_agreement:g}.")
    span = f"the last {window_s // 60} min" if window_s < 7200 else f"the last {window_s / 3600:g} h"
    mean = "no score" if stats.mean is None else f"a mean of {stats.mean:.2f}/10"
    if reason == "coverage":
        share = stats.unscored_share or 0.0
        what = (f"{share:.0%} of {stats.results + stats.skipped} results in {span} had no score or were "
                f"skipped for budget (alertNoScoreRate {profile.alert_no_score_rate:g})")
    elif reason == "drift" and baseline is not None:
        what = (f"{mean} over {stats.scored} results in {span}; the group's level is {baseline.mean:.2f} "
                f"(± {baseline.spread:.2f}), alertDriftSigma {profile.alert_drift_sigma:g}")
    else:
        what = f"{mean} over {stats.scored} results in {span}, alertThreshold {profile.alert_threshold:g}"
    return f"{'Opened' if state == 'opened' else 'Resolved'}: {what}."


def incident_signal(group: ScorerGroup, reason: IncidentReason, moved: Transition, stats: WindowStats,
                    agent_id: str, justification: str) -> Signal:
    assert group.online is not None
    return group_signal(group, id_=derived_id(f"incident-signal:{moved.incident_id}:{moved.state}"), reason=reason,
                        agent_id=agent_id, scope=group.online.scope, rating=stats.mean, justification=justification,
                        raised_at=datetime.fromtimestamp(moved.at, UTC), state=moved.state,
                        incident_id=moved.incident_id, rating_id=None)


def incident_deliveries(signal: Signal, channels: list[AlertChannel]) -> list[WebhookDelivery]:
    """One delivery per channel, each under its own agent (the sender finds a channel by it)."""
    assert signal.state is not None
    return [delivery(signal, c.url, agent_id=c.agent_id, event=INCIDENT_EVENTS[signal.state]) for c in channels]


UNWATCHED = ("Resolved: no longer watched - the group was disabled or deleted, or no longer alerts for this "
             "reason.")


def unwatched_signal(group_id: str, reason: IncidentReason, incident: str, at: float,
                     record: dict[str, Any]) -> Signal:
    """The resolution of an incident whose watch ended (``consumers.incidents`` step 5), from
    what its record kept of the group - which may be gone."""
    return Signal(
        id=derived_id(f"incident-signal:{incident}:resolved"), key=signal_key(group_id), reason=reason,
        state="resolved", incident_id=incident, group_id=group_id, group_name=record.get("groupName", group_id),
        project_id=record.get("projectId", ""), agent_id="", scope=record.get("scope", "trace"), rating=None,
        alert_threshold=record.get("alertThreshold"), severity=record.get("severity", "low"),
        justification=UNWATCHED, rating_id=None, raised_at=datetime.fromtimestamp(at, UTC))
