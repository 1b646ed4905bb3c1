"""Failure topics in the core (scoring/topics.py): planted failure modes, each written in its own
words and lengths among unrelated noise, become one topic each - purity and recall measured,
the adjusted Rand index printed - named by the mode's own words; a topic keeps its id when it is
clustered again with more results; a new result joins its mode's topic at once, noise joins
none; the text of a result is bounded."""

from __future__ import annotations

from collections import Counter

from sklearn.metrics import adjusted_rand_score

from scoring.topics import (
    INPUT_CHARS,
    JUSTIFICATION_CHARS,
    OUTPUT_CHARS,
    TEXT_CHARS,
    LowResult,
    Topic,
    low_result,
    nearest,
    topics_of,
)
from tests.support.failure_modes import MODES, low_results

MODE_WORDS = {"refund": {"refund", "policy"}, "link": {"link", "help", "invented", "docs"},
              "language": {"spanish", "hola", "english", "cuenta", "seccion"},
              "tone": {"whining", "rude", "problem", "stop"}}


def test_planted_failure_modes_become_one_named_topic_each() -> None:
    results, truth = low_results(per_mode=40, noise=30)
    topics, noise = topics_of("g-1", results)
    print(f"\n{len(topics)} topics, {len(noise)} noise; "
          f"adjusted Rand index {_rand(results, truth, topics):.3f}")
    for mode in MODES:
        # The topic holding most of the mode's results.
        best = max(topics, key=lambda t: sum(truth[m] == mode for m in t.members))
        inside = sum(truth[m] == mode for m in best.members)
        purity, recall = inside / len(best.members), inside / 40
        print(f"  {mode:<9} purity {purity:.2f} recall {recall:.2f} named {best.name!r}")
        assert purity >= 0.8 and recall >= 0.7, (mode, purity, recall, best.terms)
        assert set(" ".join(best.terms).split()) & MODE_WORDS[mode], (mode, best.terms)
    assert len({t.id for t in topics}) == len(topics)
    assert sum(truth[r] == "noise" for r in noise) >= 15, "unrelated results are left as noise"


def test_a_topic_keeps_its_id_when_clustered_again_with_more_results() -> None:
    first, truth = low_results(per_mode=30, noise=20, seed=1)
    before, _ = topics_of("g-1", first)
    more, more_truth = low_results(per_mode=10, noise=5, seed=2, start=10_000)
    truth |= more_truth
    after, _ = topics_of("g-1", first + more, previous=before)
    for mode in MODES:
        old = max(before, key=lambda t: sum(truth[m] == mode for m in t.members))
        new = max(after, key=lambda t: sum(truth[m] == mode for m in t.members))
        assert new.id == old.id, mode
        assert len(new.members) > len(old.members), "it grew with the new results"
    other_group, _ = topics_of("g-2", first)
    assert not {t.id for t in other_group} & {t.id for t in before}, "another group's topics are its own"


def test_a_new_result_joins_its_modes_topic_at_once_and_noise_joins_none() -> None:
    results, truth = low_results(per_mode=40, noise=20, seed=3)
    topics, _ = topics_of("g-1", results)
    by_mode = {mode: max(topics, key=lambda t: sum(truth[m] == mode for m in t.members)).id for mode in MODES}
    later, later_truth = low_results(per_mode=5, noise=10, seed=4, start=50_000)
    joined = Counter()
    for result in later:
        topic = nearest(result.text, topics)
        mode = later_truth[result.id]
        if mode == "noise":
            assert topic is None, result.text
        else:
            joined[topic == by_mode[mode]] += 1
    assert joined[True] >= 0.8 * sum(joined.values()), joined


def test_one_failure_alone_is_one_topic() -> None:
    results, _ = low_results(per_mode=30, noise=0, modes=["refund"], seed=5)
    topics, noise = topics_of("g-1", results)
    assert len(topics) == 1 and len(topics[0].members) >= 20, (len(topics), len(noise))  # its outliers: noise


def test_a_new_topic_never_takes_an_id_in_use() -> None:
    """A new id is made from a topic's first member; when an old topic already holds that id
    (its members went on as another cluster), the new topic gets an id of its own."""
    results, truth = low_results(per_mode=30, noise=10, modes=["refund", "link"], seed=6)
    fresh, _ = topics_of("g-1", results)
    link_id = next(t.id for t in fresh if truth[t.members[0]] == "link")
    refund = next(t for t in fresh if truth[t.members[0]] == "refund")
    # The past: the id the link results would be named by, held by a topic of the refund results.
    past = [Topic(link_id, refund.members, refund.terms, refund.centroid, refund.radius)]
    again, _ = topics_of("g-1", results, previous=past)
    ids = [t.id for t in again]
    assert len(ids) == len(set(ids)), ids
    assert next(t for t in again if truth[t.members[0]] == "refund").id == link_id, "the refunds kept their id"


def test_too_few_results_are_noise_not_topics() -> None:
    results, _ = low_results(per_mode=2, noise=1)
    topics, noise = topics_of("g-1", results)
    assert topics == [] and len(noise) == len(results)
    assert nearest("anything at all", []) is None


def test_the_text_of_a_low_result_is_bounded() -> None:
    text = low_result("r", "q" * 10_000, "a" * 10_000, ["j" * 10_000] * 10).text
    assert text.count("q") == INPUT_CHARS and text.count("a") == OUTPUT_CHARS
    assert text.count("j") == 3 * JUSTIFICATION_CHARS and len(text) <= TEXT_CHARS + 10


def _rand(results: list[LowResult], truth: dict[str, str], topics: list) -> float:
    assigned = {m: t.id for t in topics for m in t.members}
    return float(adjusted_rand_score([truth[r.id] for r in results], [assigned.get(r.id, "noise") for r in results]))
