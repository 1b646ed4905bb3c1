"""Which review queues take a result (``scoring.review_rules``), and the queue document's
save-time rules (``scorer_groups.review_queues``): errors name the wire's fields."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from scorer_groups.review_queues import ReviewQueue
from scoring.models import ScorerGroup
from scoring.results import Rating
from scoring.review_rules import REVIEW_SALT, queues_taking, review_reason
from scoring.sampling import keep

GROUP = ScorerGroup.model_validate({
    "id": "g-1", "name": "Quality", "projectId": "p-1",
    "members": [{"kind": "judge", "refId": "j", "weight": 1}],
    "online": {"enabled": True, "sampleRate": 1.0, "alertThreshold": 6.0, "severity": "high"}})
NO_THRESHOLD = GROUP.model_copy(update={"online": None})


def queue(rule: dict[str, object], **fields: object) -> ReviewQueue:
    return ReviewQueue.model_validate({"id": "q-1", "name": "Check", "projectId": "p-1", "groupIds": ["g-1"],
                                       "rule": rule, **fields})


def reason(q: ReviewQueue, *, rating: float | None, goodness: list[float | None] | None = None,
           origin: str = "live", group: ScorerGroup = GROUP, subject: str = "trace:t-1") -> str | None:
    return review_reason(q, group, origin, subject_key=subject, rating=rating,  # type: ignore[arg-type]
                         goodness=goodness or [])


def test_below_takes_a_result_under_the_threshold_or_without_a_score() -> None:
    below = queue({"below": True})
    assert reason(below, rating=5.99) == "below"
    assert reason(below, rating=None) == "below"  # a must-pass member that could not score
    assert reason(below, rating=6.0) is None  # at the threshold is not below it
    assert reason(below, rating=9.0) is None
    assert reason(below, rating=0.0, group=NO_THRESHOLD) is None  # no threshold: only "no score"
    assert reason(below, rating=None, group=NO_THRESHOLD) == "below"


def test_disagreement_takes_members_at_least_that_far_apart() -> None:
    split = queue({"disagreement": 0.4})
    assert reason(split, rating=5.0, goodness=[0.7, 0.3]) == "disagreement"  # 0.39999999999999997 in floats
    assert reason(split, rating=5.0, goodness=[0.7, 0.31]) is None
    assert reason(split, rating=5.0, goodness=[1.0, None, 0.0]) == "disagreement"  # an unscored member is no vote
    assert reason(split, rating=5.0, goodness=[1.0, None]) is None  # one verdict cannot disagree


def test_the_first_test_that_holds_is_the_reason() -> None:
    every = queue({"below": True, "disagreement": 0.1, "sampleRate": 1.0})
    assert reason(every, rating=1.0, goodness=[0.0, 1.0]) == "below"
    assert reason(every, rating=9.0, goodness=[0.5, 1.0]) == "disagreement"
    assert reason(every, rating=9.0, goodness=[1.0, 1.0]) == "sample"


def test_a_queue_takes_only_its_groups_origins_and_project() -> None:
    below = queue({"below": True})
    assert reason(below, rating=1.0, origin="backfill") is None  # origins default to live
    assert reason(queue({"below": True}, origins=["live", "backfill"]), rating=1.0, origin="backfill") == "below"
    assert reason(below, rating=1.0, group=GROUP.model_copy(update={"id": "g-2"})) is None
    # A group moved to another project is not its old project's queue's to show.
    assert reason(below, rating=1.0, group=GROUP.model_copy(update={"project_id": "p-2"})) is None


def _point(subject: str) -> float:
    """The sample point written from its definition: blake2b(subject, 0x1f, salt), top 53 bits."""
    digest = hashlib.blake2b(subject.encode() + b"\x1f" + REVIEW_SALT.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") >> 11) / 2**53


def test_the_sample_is_the_hash_rule_under_one_salt_for_every_queue() -> None:
    sampled = queue({"sampleRate": 0.05})
    subjects = [f"trace:t-{i}" for i in range(20_000)]
    taken = [s for s in subjects if reason(sampled, rating=9.0, subject=s) == "sample"]
    assert taken == [s for s in subjects if _point(s) < 0.05]
    assert 800 < len(taken) < 1200  # ~5%
    # Independent of the groups' own (unsalted) samples: of what a group at 10% keeps, ~5%.
    kept_by_group = [s for s in subjects if keep(s, 0.10)]
    share = sum(s in set(taken) for s in kept_by_group) / len(kept_by_group)
    assert 0.03 < share < 0.07, share


@given(st.floats(0.001, 1.0), st.floats(0.001, 1.0), st.text(min_size=1, max_size=40))
def test_a_smaller_queue_sample_is_a_subset_of_a_larger_one(a: float, b: float, subject: str) -> None:
    small, large = sorted((a, b))
    if reason(queue({"sampleRate": small}), rating=9.0, subject=subject) == "sample":
        assert reason(queue({"sampleRate": large}), rating=9.0, subject=subject) == "sample"


def test_queues_taking_lists_each_queue_that_takes_it_with_why() -> None:
    low, split = queue({"below": True}), queue({"disagreement": 0.5}, id="q-2")
    assert [(q.id, why) for q, why in queues_taking([low, split], GROUP, "live", subject_key="trace:t-1",
                                                      rating=2.0, goodness=[0.0, 0.9])] == [
        ("q-1", "below"), ("q-2", "disagreement")]


@pytest.mark.parametrize(("fields", "where", "says"), [
    ({"rule": {}}, "rule", "a rule takes nothing"),
    ({"rule": {"sampleRate": 1.5}}, "rule.sampleRate", "less than or equal to 1"),
    ({"rule": {"disagreement": 0}}, "rule.disagreement", "greater than 0"),
    ({"reviewersPerItem": 4}, "reviewersPerItem", "less than or equal to 3"),
    ({"reservationSeconds": 5}, "reservationSeconds", "greater than or equal to 30"),
    ({"groupIds": []}, "groupIds", "at least 1"),
    ({"groupIds": ["g-1", "g-1"]}, "", "groupIds: each value once"),
    ({"origins": ["live", "elsewhere"]}, "origins.1", "'live', 'backfill' or 'dataset'"),
    ({"capacity": 0}, "capacity", "greater than or equal to 1"),
])
def test_a_queue_is_refused_with_the_field_that_is_wrong(fields: dict[str, object], where: str, says: str) -> None:
    doc = {"id": "q-1", "name": "Check", "projectId": "p-1", "groupIds": ["g-1"], "rule": {"below": True}, **fields}
    with pytest.raises(ValidationError) as caught:
        ReviewQueue.model_validate(doc)
    (error,) = caught.value.errors()
    assert ".".join(str(part) for part in error["loc"]) == where
    assert says in error["msg"]


def test_a_queue_keeps_its_defaults_on_the_wire() -> None:
    wire = queue({"below": True}).wire()
    assert wire == {"id": "q-1", "name": "Check", "projectId": "p-1", "groupIds": ["g-1"],
                    "rule": {"below": True, "disagreement": None, "sampleRate": None}, "origins": ["live"],
                    "reviewersPerItem": 1, "reservationSeconds": 600, "capacity": 1000, "keepDays": 30,
                    "maxBytes": 64 * 1024 * 1024}


def test_an_item_shows_no_secret_a_judge_or_the_trace_quoted() -> None:
    """Reviewer keys read items: the subject's texts, the justification and every member's detail
    are cut of secrets' shapes (a judge may quote the key a trace carried)."""
    from scorer_groups.review_queues import ReviewItem
    from scoring.review_rules import review_item
    from scoring.subjects import Subject

    leaked = "the tool printed sk-live_4eC39HqLyjWDarjtT1zdp7dc"
    rating = Rating.model_validate({
        "id": "r-1", "groupId": "g-1", "groupName": "Quality", "projectId": "p-1", "agentId": "a", "scope": "trace",
        "traceId": "t-1", "kind": "k", "rating": 2.0, "reason": None, "justification": f"Weighted: {leaked}",
        "scoredAt": "2026-12-06T10:00:00Z",
        "members": [{"kind": "judge", "refId": "j", "name": "Judge", "weight": 1.0, "gate": False,
                     "status": "scored", "native": 2.0, "goodness": 0.2, "detail": f"It leaked: {leaked}"}]})
    subject = Subject(scope="trace", input=f"Bearer abcdefghijklmnop {leaked}", output=leaked, expected=None,
                      spans=(), metadata={}, transcript="", project_id="p-1", agent_id="a", trace_id="t-1")
    item = review_item(queue({"below": True}), "below", "live", subject, rating, rating.to_json())
    shown = ReviewItem.model_validate_json(item.to_json()).model_dump_json()
    assert "4eC39HqLyjWDarjtT1zdp7dc" not in shown and "abcdefghijklmnop" not in shown
    assert item.rating.members[0].detail is not None and item.rating.members[0].detail.startswith("It leaked: ")
    assert item.id.startswith("q-1:")


def test_a_group_is_watched_by_ten_queues_at_most() -> None:
    """Each queue keeps its own copy of every result it takes: the copies of a result are bounded."""
    from scoring.catalog import MAX_QUEUES_PER_GROUP, CatalogSnapshot, queue_errors

    watching = {f"q-{n}": queue({"below": True}, id=f"q-{n}") for n in range(MAX_QUEUES_PER_GROUP)}
    catalog = CatalogSnapshot(groups={"g-1": GROUP}, queues=watching)
    assert queue_errors(queue({"below": True}, id="q-new"), catalog, None) == [
        "groupIds[0]: group 'g-1' is watched by 10 review queues already, the most a group may have (10): each "
        "queue keeps its own copy of every result it takes"]
    assert queue_errors(watching["q-3"], catalog, watching["q-3"]) == [], "a queue already watching it may change"
    assert queue_errors(queue({"below": True}, id="q-new"), CatalogSnapshot(groups={"g-1": GROUP}), None) == []


def test_the_hot_paths_item_is_the_models_item() -> None:
    """``kept_items`` (orjson from the published document, texts masked once) against
    ``review_item`` (the models), for a live result with a judge, a gate and a secret in its texts."""
    from adapters.stores.review_items import _score_card
    from scorer_groups.review_queues import ReviewItem, ScoreCard
    from scoring.blend import MemberOutcome, blend
    from scoring.panel import GroupResult
    from scoring.ports import TokenUsage
    from scoring.results import encode_rating
    from scoring.review_rules import kept_items, review_item
    from scoring.subjects import Trace, trace_subject

    leaked = "sk-live_4eC39HqLyjWDarjtT1zdp7dc"
    trace = Trace.model_validate({"traceId": "t-1", "projectId": "p-1", "agentId": "a-1",
                                  "timestamp": "2026-12-06T10:00:00Z",
                                  "spans": [{"spanId": "r", "input": f"use {leaked}", "output": "Sorry."}]})
    outcomes = [MemberOutcome(name="Judge", kind="judge", weight=1, gate=False, ref_id="j", native=3, goodness=0.3,
                              detail=f"It quoted {leaked}.", usage=TokenUsage(120, None)),
                MemberOutcome(name="Broken", kind="custom", weight=1, gate=False, ref_id="c", error="ZeroDivision"),
                MemberOutcome(name="PII", kind="pattern", weight=2, gate=True, ref_id="e", native=False, goodness=1.0,
                              detail="template email did not match the output")]
    subject = trace_subject(trace)
    published = encode_rating(GroupResult(GROUP, subject, blend(outcomes)), "trace")
    taking = [(queue({"below": True}), "below"), (queue({"sampleRate": 1.0}, id="q-2"), "sample")]
    kept = kept_items(taking, "live", subject, published)  # type: ignore[arg-type]
    assert [k.id.split(":")[0] for k, _ in kept] == ["q-1", "q-2"]
    for (item, q), (wanted_queue, reason) in zip(kept, taking, strict=True):
        model = review_item(wanted_queue, reason, "live", subject, published, published.document)  # type: ignore[arg-type]
        assert q is wanted_queue
        assert ReviewItem.model_validate_json(item.document) == model
        assert ScoreCard.model_validate_json(item.card) == ScoreCard.model_validate_json(_score_card(model))
        assert b"4eC39HqLyjWDarjtT1zdp7dc" not in item.document
