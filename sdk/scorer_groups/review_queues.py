"""A review queue: where people check the judges on live traffic. A queue belongs to a
project, watches some of its groups, and takes a result when the result is published - by the
worker, from what it already holds, never by reading Kafka again - if its ``rule`` says so.

The wire contract of the queue document; the decision itself is the server's
(``scoring.review_rules``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from scorer_groups.agreement import Agreement
from scorer_groups.documents import Document, Rating, ResultScope
from scorer_groups.models import Id, Name
from scorer_groups.wire import WireModel

MAX_QUEUE_GROUPS = 50
DEFAULT_RESERVATION_S = 600
DEFAULT_QUEUE_CAPACITY = 1_000
# The bytes a queue's items may take in Redis (their documents and score cards), open or done:
# past it, a result is turned away as at capacity. A project's queues share its review quotas
# (SGW_MAX_PROJECT_REVIEW_BYTES, SGW_MAX_PROJECT_REVIEW_ITEMS), checked when a queue is saved.
DEFAULT_QUEUE_MAX_BYTES = 64 * 1024 * 1024
MAX_QUEUE_MAX_BYTES = 16 * 1024**3
KEPT_PER_OPEN = 10  # items a queue keeps, open or done, per open item of capacity
MAX_QUEUE_CAPACITY = 100_000
DEFAULT_ITEM_KEEP_DAYS = 30

# Where a result comes from: live scoring, a backfill, a dataset run's row.
ReviewOrigin = Literal["live", "backfill", "dataset"]
# Why an item is in its queue: the rule's first test that held, or added by hand.
ReviewReason = Literal["below", "disagreement", "sample", "added"]
ItemState = Literal["open", "done"]
# What an item keeps of the subject's texts (characters each; cut of secrets' shapes too): enough
# for a person to judge the answer, bounded in Redis (capacity x this).
ITEM_TEXT_MAX_CHARS = 20_000
ITEM_TEXT_MAX_BYTES = 48 * 1024


def _live_only() -> list[ReviewOrigin]:
    return ["live"]


class ReviewRule(WireModel):
    """Which results a queue takes, any of these (at least one set):

    - ``below``: the result is below its group's ``alertThreshold``, or has no score at all;
    - ``disagreement``: its members' goodness values (0..1) are at least this far apart;
    - ``sampleRate``: a consistent sample of the rest - the same hash rule as sampling, under one
      salt for every queue, so a queue at 2% takes a subset of what one at 5% takes."""

    below: bool = False
    disagreement: float | None = Field(None, gt=0, le=1)
    sample_rate: float | None = Field(None, gt=0, le=1)

    @model_validator(mode="after")
    def _says_something(self) -> ReviewRule:
        if not self.below and self.disagreement is None and self.sample_rate is None:
            raise ValueError("a rule takes nothing: set below, disagreement or sampleRate")
        return self


class ReviewQueue(WireModel):
    """A queue of results for people to label. When ``capacity`` open items are waiting, a result
    the rule would take is turned away (and counted: ``sgw_review_items_turned_away_total``)
    rather than pushing an older item out - what people have not reached yet is not lost to what
    came after it."""

    id: Id
    name: Name
    project_id: Id
    group_ids: list[Id] = Field(min_length=1, max_length=MAX_QUEUE_GROUPS)
    rule: ReviewRule
    origins: list[ReviewOrigin] = Field(default_factory=_live_only, min_length=1, max_length=3)
    reviewers_per_item: int = Field(1, ge=1, le=3)
    reservation_seconds: int = Field(DEFAULT_RESERVATION_S, ge=30, le=86_400)
    capacity: int = Field(DEFAULT_QUEUE_CAPACITY, ge=1, le=MAX_QUEUE_CAPACITY)
    keep_days: int = Field(DEFAULT_ITEM_KEEP_DAYS, ge=1, le=365,
                           description="How long an item is kept, open or labelled (its labels too).")
    max_bytes: int = Field(DEFAULT_QUEUE_MAX_BYTES, ge=1024 * 1024, le=MAX_QUEUE_MAX_BYTES,
                           description="Bytes its items may take, open or labelled; past it a result is turned "
                                       "away, as at capacity.")

    @model_validator(mode="after")
    def _each_once(self) -> ReviewQueue:
        for wire_name, values in (("groupIds", self.group_ids), ("origins", self.origins)):
            if len(set(values)) != len(values):
                raise ValueError(f"{wire_name}: each value once")
        return self


class ReviewSubject(Document):
    """What the group saw: the request and the answer (a session's transcript), cut at
    ``ITEM_TEXT_MAX_CHARS`` with secrets' shapes masked."""

    scope: ResultScope
    trace_id: str | None = None
    session_id: str | None = None
    span_id: str | None = None
    span_name: str | None = None
    input: str
    output: str
    transcript: str = ""


class ScoreCard(Document):
    """What the machine said of an item's result - the group's score, each judge member's verdict
    by ref id (0-10) - kept beside the item for the agreement figures."""

    group_id: str
    rating_id: str
    rating: float | None
    judges: dict[str, float] = Field(default_factory=dict)


class ReviewItem(Document):
    """One result in one queue, for people to label, as kept. Its id is ``<queue id>:<uuid>``, the
    uuid derived from the queue and the rating: a result published again (a redelivery) is the
    same item, never a second one. Its state and labels are kept beside it (``ItemView``)."""

    id: str
    queue_id: str
    project_id: str
    group_id: str
    rating_id: str
    reason: ReviewReason
    origin: ReviewOrigin
    created_at: datetime
    subject: ReviewSubject
    rating: Rating


MAX_LABEL_COMMENT_CHARS = 2_000


class MemberLabel(WireModel):
    """A reviewer's word on one member's verdict: agree or not, and what they would have given
    (0-10, on the group's scale)."""

    agree: bool
    rating: float | None = Field(None, ge=0, le=10)


class LabelBody(WireModel):
    """``PUT /v1/review-items/{id}/labels/me``: the reviewer's rating of the result (0-10), their
    word on members by ref id (``members.<ref>``), and a comment."""

    rating: float = Field(ge=0, le=10)
    members: dict[str, MemberLabel] = Field(default_factory=dict, max_length=50)
    comment: str | None = Field(None, max_length=MAX_LABEL_COMMENT_CHARS)


class ReviewLabel(Document):
    """One reviewer's label of one item, as kept and published: who (the key's name and id), when."""

    item_id: str
    queue_id: str
    project_id: str
    group_id: str
    rating_id: str
    reviewer: str
    reviewer_key: str
    rating: float
    members: dict[str, MemberLabel] = Field(default_factory=dict)
    comment: str | None = None
    labelled_at: datetime
    version: int = 1  # 1 for a reviewer's first label of the item, then one more each change


class ItemView(Document):
    """An item as the API shows it: the item, its state, its labels, and - to the reviewer who
    took it - until when it is theirs."""

    item: ReviewItem
    state: ItemState
    labels: list[ReviewLabel]
    reserved_until: datetime | None = None


class ReviewerAgreement(WireModel):
    """People with each other, over the items two or more reviewers labelled (the first two
    labels of each, by reviewer key): how far a judge can be held to people who differ this much."""

    items: int
    spearman: float | None = None
    kappa: float | None = None  # pass/fail at the group's alertThreshold (5 without one)
    mean_absolute_error: float | None = None


class LiveAgreement(WireModel):
    """``GET /v1/scorer-groups/{id}/agreement``: the group's and each judge member's agreement with
    people over the labelled review items of its results (the people's verdict of an item: the
    median of its reviewers' ratings), as the labels come in. ``agreement`` is null until an item
    is labelled."""

    labelled_items: int
    agreement: Agreement | None = None
    reviewers: ReviewerAgreement | None = None


class QueueCounts(WireModel):
    open: int  # open items now (at most the queue's capacity)
    taken: int  # items the queue has taken since it began
    turned_away: int  # results its rule took while it held its capacity of open items


class ReviewProgress(WireModel):
    """``GET /v1/review-queues/{id}/progress``: where a reviewer stands - open items now, items
    done (all their labels given) and kept, and the items this key labelled in the queue."""

    open: int
    done: int
    mine: int


class ItemPage(Document):
    """``GET /v1/review-queues/{id}/items``: a page of items (open, oldest first; or all, newest
    first) with the queue's counts."""

    items: list[ReviewItem]
    counts: QueueCounts
    next_cursor: str | None = Field(None, description="Pass as cursor for the next page; null on the last.")


class Labelled(Document):
    """``PUT /v1/review-items/{id}/labels/me``'s answer: the label as kept, and whether the item
    is done by it (it has its reviewersPerItem labels and left the open items)."""

    label: ReviewLabel
    done: bool


MAX_ADDED_AT_ONCE = 100


class AddItems(WireModel):
    """``POST /v1/review-queues/{id}/items``: results to put in the queue by hand - rating ids among
    the latest results of one group the queue watches (``groupId``: implied when it watches one)."""

    rating_ids: list[Id] = Field(min_length=1, max_length=MAX_ADDED_AT_ONCE)
    group_id: Id | None = None


class AddedItems(Document):
    """What adding by hand did: items ``added``, ``already`` in the queue (left as they were),
    ``turnedAway`` (the queue was full: counted as the rule's are), and the rating ids ``missing``
    (not among the group's latest results: gone, or never the group's)."""

    added: int
    already: int
    turned_away: int
    missing: list[str]
