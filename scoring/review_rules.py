"""Which review queues take a published result: decided where the result is
published, from what the publisher already holds - pure, no I/O.

A queue takes a result of one of its groups, from one of its origins, when the first of its
rule's tests that holds says so, in this order (the reason the item carries):

1. ``below``: the result has no score, or its score is below the group's ``alertThreshold``;
2. ``disagreement``: the members' goodness values (0..1) span at least the rule's figure;
3. ``sample``: the result's subject falls in the queue's sample (``scoring.sampling``'s point
   under ``REVIEW_SALT``: one salt for every queue, so the samples nest across queues, and are
   independent of the groups' own samples).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import orjson

from scorer_groups.review_queues import (
    ITEM_TEXT_MAX_BYTES,
    ITEM_TEXT_MAX_CHARS,
    ReviewItem,
    ReviewOrigin,
    ReviewQueue,
    ReviewReason,
    ReviewSubject,
)
from scoring.frozen import frozen
from scoring.judge_calls import shown_text
from scoring.models import ScorerGroup
from scoring.redact import redact_text
from scoring.results import PublishedRating, Rating, derived_id
from scoring.sampling import keep
from scoring.subjects import Subject

REVIEW_SALT = "review-queues"


def review_reason(queue: ReviewQueue, group: ScorerGroup, origin: ReviewOrigin, *, subject_key: str,
                  rating: float | None, goodness: Sequence[float | None]) -> ReviewReason | None:
    """Why ``queue`` takes this result of ``group`` (``subject_key``: the rating's dedupe
    subject - a trace, a span or a session at a turn count; ``goodness``: its members'), or None."""
    if group.id not in queue.group_ids or origin not in queue.origins or group.project_id != queue.project_id:
        return None
    rule = queue.rule
    if rule.below:
        threshold = group.online.alert_threshold if group.online is not None else None
        if rating is None or (threshold is not None and rating < threshold):
            return "below"
    if rule.disagreement is not None:
        scored = [g for g in goodness if g is not None]
        if len(scored) >= 2 and max(scored) - min(scored) >= rule.disagreement - 1e-12:
            return "disagreement"
    if rule.sample_rate is not None and keep(subject_key, rule.sample_rate, REVIEW_SALT):
        return "sample"
    return None


def queues_taking(queues: Iterable[ReviewQueue], group: ScorerGroup, origin: ReviewOrigin, *, subject_key: str,
                  rating: float | None, goodness: Sequence[float | None]) -> list[tuple[ReviewQueue, ReviewReason]]:
    """Every queue among ``queues`` (a group's watchers) that takes the result, with why."""
    taken = []
    for queue in queues:
        reason = review_reason(queue, group, origin, subject_key=subject_key, rating=rating, goodness=goodness)
        if reason is not None:
            taken.append((queue, reason))
    return taken


def review_item_id(queue_id: str, rating_id: str) -> str:
    """``<queue id>:<uuid>``: an item names its queue (a uuid has no ":"), so the API finds it
    from its id alone, and a queue of another project answers 404."""
    return f"{queue_id}:{derived_id(f'review-item:{queue_id}:{rating_id}')}"


def queue_of_item(item_id: str) -> str:
    return item_id.rpartition(":")[0]


def review_item(queue: ReviewQueue, reason: ReviewReason, origin: ReviewOrigin, subject: Subject,
                rating: PublishedRating | Rating, document: bytes) -> ReviewItem:
    """The item ``queue`` keeps of a published result (``document``: its rating as published)."""
    shown = _shown
    return ReviewItem(
        id=review_item_id(queue.id, rating.id), queue_id=queue.id, project_id=queue.project_id,
        group_id=rating.group_id, rating_id=rating.id, reason=reason, origin=origin, created_at=rating.scored_at,
        subject=ReviewSubject(scope=rating.scope, trace_id=rating.trace_id, session_id=rating.session_id,
                              span_id=rating.span_id, span_name=rating.span_name, input=shown(subject.input),
                              output=shown(subject.output), transcript=shown(subject.transcript)),
        rating=_masked(Rating.model_validate_json(document)))


def added_item(queue: ReviewQueue, rating: Rating) -> ReviewItem:
    """The item a result put in ``queue`` by hand makes: what the results list kept of it (its
    verdicts), without the trace's texts - only the publisher holds those."""
    return ReviewItem(
        id=review_item_id(queue.id, rating.id), queue_id=queue.id, project_id=queue.project_id,
        group_id=rating.group_id, rating_id=rating.id, reason="added",
        origin=rating.origin or ("dataset" if rating.run_id else "live"), created_at=rating.scored_at,
        subject=ReviewSubject(scope=rating.scope, trace_id=rating.trace_id, session_id=rating.session_id,
                              span_id=rating.span_id, span_name=rating.span_name, input="", output=""),
        rating=_masked(rating))


def _masked(rating: Rating) -> Rating:
    """The verdicts' texts cut of secrets' shapes, as the subject's are: a judge may quote a key
    the trace carried, and reviewer keys read items."""
    members = [m.model_copy(update={"detail": redact_text(m.detail)}) if m.detail else m for m in rating.members]
    return rating.model_copy(update={"justification": redact_text(rating.justification),
                                     "reason": redact_text(rating.reason) if rating.reason else rating.reason,
                                     "members": members})


def rated_items(queues: Iterable[ReviewQueue], group: ScorerGroup, origin: ReviewOrigin, subject: Subject,
                subject_key: str, rating: Rating) -> list[tuple[ReviewItem, ReviewQueue]]:
    """The items a validated rating makes (a dataset run's row: the live path decides from what
    it publishes, ``scoring.outbox``), each with its queue."""
    taking = queues_taking(queues, group, origin, subject_key=subject_key, rating=rating.rating,
                           goodness=[m.goodness for m in rating.members])
    return [(review_item(queue, reason, origin, subject, rating, rating.to_json()), queue) for queue, reason in taking]


@frozen
class KeptItem:
    """A review item encoded for keeping - the hot path's: built from the published rating's
    document, its texts masked once for every queue that takes the result, without building
    models (a test holds it to ``review_item``'s)."""

    id: str
    document: bytes  # the ReviewItem's JSON
    card: bytes  # its ScoreCard's JSON


Kept = tuple[KeptItem, ReviewQueue]  # an item with the queue that keeps it


def kept_items(taking: Sequence[tuple[ReviewQueue, ReviewReason]], origin: ReviewOrigin, subject: Subject,
               rating: PublishedRating) -> list[Kept]:
    """The items a published result makes in the queues ``taking`` it (``queues_taking``)."""
    fields = rating.fields
    members = fields["members"]
    masked = {**fields, "justification": redact_text(fields["justification"]),
              "reason": redact_text(fields["reason"]) if fields["reason"] else fields["reason"],
              "members": [{**m, "detail": redact_text(m["detail"])} if m["detail"] else m for m in members]}
    shown = {"scope": rating.scope, "traceId": rating.trace_id, "sessionId": rating.session_id,
             "spanId": rating.span_id, "spanName": rating.span_name, "input": _shown(subject.input),
             "output": _shown(subject.output), "transcript": _shown(subject.transcript)}
    card = orjson.dumps({"groupId": rating.group_id, "ratingId": rating.id, "rating": rating.rating,
                         "judges": {m["refId"]: float(m["native"]) for m in members
                                    if m["kind"] == "judge" and m["status"] == "scored" and m["native"] is not None
                                    and not isinstance(m["native"], bool)}})
    kept = []
    for queue, reason in taking:
        item_id = review_item_id(queue.id, rating.id)
        document = orjson.dumps({"id": item_id, "queueId": queue.id, "projectId": queue.project_id,
                                 "groupId": rating.group_id, "ratingId": rating.id, "reason": reason, "origin": origin,
                                 "createdAt": fields["scoredAt"], "subject": shown, "rating": masked},
                                option=orjson.OPT_UTC_Z)
        kept.append((KeptItem(item_id, document, card), queue))
    return kept


def _shown(text: str) -> str:
    return shown_text(text, ITEM_TEXT_MAX_CHARS, ITEM_TEXT_MAX_BYTES) if text else ""
