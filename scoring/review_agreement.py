"""Agreement as it happens: the judges against people over a group's labelled review items.

The figures are ``scoring.calibration``'s, with an item for a row; the people's verdict of an item is the
median of its reviewers' ratings. Pure: the API reads the items and their labels
(``adapters.stores.review_items``). The columns: docs/design-notes.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from scorer_groups.review_queues import LiveAgreement, ReviewerAgreement, ScoreCard
from scoring.calibration import HumanVerdict, MachineColumn, agreement, cohen_kappa, mean_absolute_error, spearman
from scoring.incidents import JudgeAgreement
from scoring.models import ScorerGroup

DEFAULT_MARK = 5.0  # people's pass at 5 when the group has no alertThreshold


def live_agreement(group: ScorerGroup, labelled: Sequence[tuple[ScoreCard, Mapping[str, Mapping[str, Any]]]]
                   ) -> LiveAgreement:
    """``labelled``: the group's items - what the machine said - with their labels by reviewer
    key (one per result)."""
    rows = [(item, labels) for item, labels in labelled if labels]
    if not rows:
        return LiveAgreement(labelled_items=0)
    humans = [HumanVerdict(rating=statistics.median(float(label["rating"]) for label in labels.values()))
              for _, labels in rows]  # 1.
    judges = [m for m in group.members if m.kind == "judge"]
    columns = [MachineColumn("group", group.name, None, [card.rating for card, _ in rows])]  # 2.
    for member in judges:
        columns.append(MachineColumn("judge", member.label or member.ref_id, member.ref_id,
                                     [card.judges.get(member.ref_id) for card, _ in rows]))
    threshold = group.online.alert_threshold if group.online is not None else None
    found = agreement(humans, columns, ids=[card.rating_id for card, _ in rows], alert_threshold=threshold)
    return LiveAgreement(labelled_items=len(rows), agreement=found,
                         reviewers=_reviewers(rows, threshold if threshold is not None else DEFAULT_MARK))


def judge_agreements(group: ScorerGroup, labelled: Sequence[tuple[ScoreCard, Mapping[str, Mapping[str, Any]]]]
                     ) -> list[JudgeAgreement]:
    """Each judge member's Spearman correlation with people over ``labelled`` (a window of the
    group's labelled items, as ``live_agreement`` reads them): the agreement watch's and the
    gauge's figure."""
    rows = [(card, statistics.median(float(label["rating"]) for label in labels.values()))
            for card, labels in labelled if labels]
    found = []
    for member in group.members:
        if member.kind != "judge":
            continue
        pairs = [(card.judges[member.ref_id], people) for card, people in rows if member.ref_id in card.judges]
        figure = spearman([m for m, _ in pairs], [p for _, p in pairs]) if len(pairs) >= 2 else None
        if figure is None and len({m for m, _ in pairs}) == 1 and len({p for _, p in pairs}) > 1:
            figure = 0.0  # a judge stuck on one verdict while people differ tells them apart not at all
        found.append(JudgeAgreement(member.ref_id, member.label or member.ref_id, _round(figure), len(pairs)))
    return found


def _reviewers(rows: Sequence[tuple[ScoreCard, Mapping[str, Mapping[str, Any]]]], mark: float
               ) -> ReviewerAgreement | None:
    """3."""
    firsts, seconds = [], []
    for _, labels in rows:
        if len(labels) >= 2:
            a, b = (float(labels[key]["rating"]) for key in sorted(labels)[:2])
            firsts.append(a)
            seconds.append(b)
    if not firsts:
        return None
    return ReviewerAgreement(
        items=len(firsts), spearman=_round(spearman(firsts, seconds)),
        kappa=_round(cohen_kappa([a >= mark for a in firsts], [b >= mark for b in seconds])),
        mean_absolute_error=_round(mean_absolute_error(firsts, seconds)))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
