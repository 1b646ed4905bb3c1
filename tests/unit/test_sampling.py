"""Sampling is consistent across groups (the keep point depends on the subject, and a salt if the
group sets one), nested across rates, stable across processes, uniform, and exact at 0 and 1.

Expectations are computed independently of ``scoring.sampling``: points worked out by hand with
hashlib (the first 8 bytes of blake2b of the subject, big-endian, top 53 bits over 2^53), and
the reference written from that definition (``tests.support.sampling_reference``).
"""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from scoring.catalog import CatalogSnapshot
from scoring.models import Pattern, ScorerGroup
from scoring.routing import route
from scoring.sampling import keep, sample_point
from scoring.subjects import Trace
from tests.support.sampling_reference import reference_keep

# blake2b(subject, digest_size=8): hex digest -> its point, worked out once by hand.
HAND_CHECKED = {
    "t-1": ("c3415115f09b0bc2", 0.7627154043735623),
    "t-2": ("dc9790d5f92e2f8d", 0.8616877100368404),
    "trace-42": ("9632eebb1c60bd97", 0.5867146689237214),
    "s-7": ("84cd0cdf5475d173", 0.5187538190115994),
}
# The point of the pair ("t-1", "grp-7") as every group had it before consistent sampling:
# blake2b(b"t-1" + b"\x1f" + b"grp-7") = 7e177f8940cb8515.
PAIR_POINT = 0.4925460538950528


IDS = [f"t-{i}" for i in range(5000)]


@pytest.mark.parametrize("subject", sorted(HAND_CHECKED))
def test_the_point_is_the_subjects_own_hash_and_nothing_else(subject: str) -> None:
    digest, point = HAND_CHECKED[subject]
    assert hashlib.blake2b(subject.encode(), digest_size=8).hexdigest() == digest  # the hand check itself
    assert sample_point(subject) == point
    assert keep(subject, point + 1e-9) and not keep(subject, point)


def rubric(group_id: str, sample_rate: float) -> ScorerGroup:
    """A live trace-scope group of project "acme", unsalted, that no filter narrows."""
    return ScorerGroup.model_validate({
        "id": group_id, "name": group_id, "projectId": "acme",
        "online": {"enabled": True, "sampleRate": sample_rate, "alertThreshold": None, "severity": "low"},
        "members": [{"kind": "pattern", "refId": "p", "weight": 1, "gate": False}]})


def test_two_groups_at_the_same_rate_keep_the_same_traces() -> None:
    # Whatever the groups are called: the decision, made where live traffic is routed, does not
    # read the group - the old and the new rubric grade the same fifth of the traffic.
    old, new = rubric("old-rubric", 0.2), rubric("rubric-v2", 0.2)
    assert old.id != new.id and old.online.sample_salt is None is new.online.sample_salt  # type: ignore[union-attr]
    catalog = CatalogSnapshot(version=1, groups={f"acme/{g.id}": g for g in (old, new)},
                              patterns={"p": Pattern(id="p", name="P", polarity="failure", contains=["refund"])})
    kept: dict[str, set[str]] = {"old-rubric": set(), "rubric-v2": set()}
    for t in IDS:
        trace = Trace.model_validate({"traceId": t, "projectId": "acme", "agentId": "a",
                                      "timestamp": "2026-12-02T13:00:00Z", "spans": [{"spanId": "r", "output": "ok"}]})
        for pair in route(trace, catalog).pairs:
            kept[pair.group.id].add(t)
    assert kept["old-rubric"] == kept["rubric-v2"] == {t for t in IDS if reference_keep(t, 0.2)}
    assert 800 < len(kept["old-rubric"]) < 1200


def test_a_lower_rate_keeps_a_subset_of_a_higher_one() -> None:
    for low, high in ((0.1, 0.2), (0.01, 0.5), (0.5, 0.9)):
        small = {t for t in IDS if keep(t, low)}
        large = {t for t in IDS if keep(t, high)}
        assert small < large, (low, high)
        assert small == {t for t in IDS if reference_keep(t, low)}


def test_two_salts_give_independent_samples_of_the_right_size() -> None:
    a = {t for t in IDS if keep(t, 0.3, "v1")}
    b = {t for t in IDS if keep(t, 0.3, "v2")}
    assert a == {t for t in IDS if reference_keep(t, 0.3, "v1")}
    assert a != b and a != {t for t in IDS if keep(t, 0.3)}
    n, rate = len(IDS), 0.3
    sd = (n * rate * (1 - rate)) ** 0.5
    assert abs(len(a) - n * rate) < 5 * sd and abs(len(b) - n * rate) < 5 * sd
    # Independent: the overlap is about rate x rate of the traffic, not rate (the same sample).
    both = len(a & b)
    assert abs(both - n * rate * rate) < 5 * (n * rate * rate * (1 - rate * rate)) ** 0.5, both


def test_a_salt_equal_to_the_group_id_keeps_the_sample_groups_had_before() -> None:
    assert sample_point("t-1", "grp-7") == PAIR_POINT


def test_exact_at_zero_and_one() -> None:
    assert not any(keep(t, 0) for t in IDS)
    assert all(keep(t, 1) for t in IDS)
    assert all(keep(t, 1.0, "salt") for t in IDS)


def test_same_decision_in_another_process() -> None:
    ids = [f"trace-{i}" for i in range(200)]
    here = "".join("1" if keep(t, 0.37, "s") else "0" for t in ids)
    code = ("from scoring.sampling import keep;"
            f"print(''.join('1' if keep(t, 0.37, 's') else '0' for t in {ids!r}))")
    # A different hash seed: Python's salted hash() would decide differently.
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "12345", "PYTHONPATH": "."}).stdout.strip()
    assert here == there == "".join("1" if reference_keep(t, 0.37, "s") else "0" for t in ids)


def test_kept_fraction_matches_the_rate() -> None:
    n = 40_000
    for rate in (0.01, 0.2, 0.5, 0.9):
        kept = sum(keep(f"t-{i}", rate) for i in range(n))
        # Within 5 standard deviations of a binomial draw (the ids are fixed, so the test is too).
        sd = (n * rate * (1 - rate)) ** 0.5
        assert abs(kept - n * rate) < 5 * sd, (rate, kept)


def test_points_are_uniform_chi_square() -> None:
    n, bins = 50_000, 20
    counts = [0] * bins
    for i in range(n):
        counts[int(sample_point(f"session-{i}") * bins)] += 1
    expected = n / bins
    chi2 = sum((c - expected) ** 2 / expected for c in counts)
    # 19 degrees of freedom: the 99.9th percentile is 43.8.
    assert chi2 < 43.8, counts


def test_points_lie_in_zero_one() -> None:
    assert all(0 <= sample_point(str(i), salt) < 1 for i in range(10_000) for salt in ("", "g"))
