"""The lock-free hot-path metrics expose exactly what prometheus_client's own types would."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from worker.loop_metrics import LoopCounter, LoopHistogram
from worker.metrics import LATENCY_BUCKETS, SCORE_BUCKETS

# Values on a bucket's bound (an "le" bucket includes it), between bounds, past the last, zero.
SCORES = [0, 0.0, 1, 2.5, 3, 6.999, 7, 10, 10.0, 9.5, 4, 4.000001]
SECONDS = [0.0, 0.004, 0.005, 0.0050001, 0.1, 0.3, 60, 120, 121, 1e6, 2.5, math.nan]  # NaN: in the sum only


def _exposed(registry: CollectorRegistry) -> list[str]:
    # prometheus_client adds a "_created" timestamp series per child; the loop types do not.
    return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]


@pytest.mark.parametrize(("buckets", "values"), [(SCORE_BUCKETS, SCORES), (LATENCY_BUCKETS, SECONDS)])
def test_a_loop_histogram_exposes_the_same_buckets_count_and_sum_as_a_prometheus_histogram(
        buckets: tuple[float, ...], values: list[float]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("sgw_x", "X.", ["project", "group"], buckets=buckets, registry=theirs)
    loop = LoopHistogram("sgw_x", "X.", ["project", "group"], buckets=buckets, registry=ours)
    for i, value in enumerate(values):
        labels = ("acme", "g1" if i % 3 else "g2")
        reference.labels(*labels).observe(value)
        loop.labels(*labels).observe(value)
    assert _exposed(ours) == _exposed(theirs)


def test_a_loop_histogram_without_labels_and_bounds_given_unsorted() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Histogram("sgw_y_seconds", "Y.", buckets=(0.5, 1, math.inf), registry=theirs)
    loop = LoopHistogram("sgw_y_seconds", "Y.", buckets=(1, 0.5), registry=ours)
    for value in (0.5, 0.7, 1.0, 3.0):
        reference.observe(value)
        loop.observe(value)
    assert _exposed(ours) == _exposed(theirs)


def test_a_loop_counter_exposes_the_same_totals_as_a_prometheus_counter() -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    reference = Counter("sgw_groups_scored", "Z.", ["group", "outcome"], registry=theirs)
    loop = LoopCounter("sgw_groups_scored", "Z.", ["group", "outcome"], registry=ours)
    for labels, amount in ((("g1", "scored"), 1), (("g1", "scored"), 2.5), (("g2", "no_score"), 1)):
        reference.labels(*labels).inc(amount)
        loop.labels(*labels).inc(amount)
    assert _exposed(ours) == _exposed(theirs)
    assert ours.get_sample_value("sgw_groups_scored_total", {"group": "g1", "outcome": "scored"}) == 3.5


def test_wrong_labels_and_a_falling_counter_are_refused() -> None:
    registry = CollectorRegistry()
    histogram = LoopHistogram("sgw_h", "H.", ["kind"], buckets=(1,), registry=registry)
    counter = LoopCounter("sgw_c", "C.", ["kind"], registry=registry)
    with pytest.raises(ValueError, match="takes labels"):
        histogram.labels("a", "b")
    with pytest.raises(ValueError, match="takes labels"):
        counter.labels()
    with pytest.raises(ValueError, match="only goes up"):
        counter.labels("a").inc(-1)
