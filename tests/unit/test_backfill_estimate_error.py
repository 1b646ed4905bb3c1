"""A backfill estimate's error bar says what it claims: on bursty traffic - a
tenant's traces come in runs, and the estimate reads runs of records - its 95% interval holds
the true count of pairs about 95 times in 100; a whole read is exact; too little read, or no pair
seen, is unknown - not exact, and no figure that would tell the shared topic's size."""

from __future__ import annotations

import random

from consumers.backfill_estimate import RUN, _error


def bursty(rng: random.Random, records: int, burst: int) -> list[int]:
    """Pairs per record: the project's traffic in bursts of ``burst`` records (each kept by a
    50% sample), other projects' between them."""
    out: list[int] = []
    while len(out) < records:
        ours = rng.random() < 0.3
        out += [int(ours and rng.random() < 0.5) for _ in range(burst)]
    return out[:records]


def sampled(population: list[int], runs: int) -> list[tuple[int, int]]:
    step = len(population) // runs
    return [(RUN, sum(population[i * step:i * step + RUN])) for i in range(runs)]


def test_the_95_percent_interval_holds_the_truth_on_bursty_traffic() -> None:
    rng = random.Random(58)
    trials, held = 200, 0
    for _ in range(trials):
        population = bursty(rng, 20_000, burst=rng.choice([1, 20, 200]))
        runs = sampled(population, 40)
        covered, pairs = sum(o for o, _ in runs), sum(m for _, m in runs)
        error = _error(len(population), covered, runs, pairs)
        assert error is not None
        held += abs(pairs * len(population) / covered - sum(population)) <= error
    assert held >= 0.88 * trials, f"held {held} of {trials}"


def test_a_whole_read_is_exact_too_little_is_unknown_and_nothing_seen_is_bounded() -> None:
    assert _error(500, 500, [(500, 40)], 40) == 0.0
    assert _error(10_000, 50, [(50, 3)], 3) is None, "one run: no spread to measure"
    assert _error(10_000, 100, [(50, 0), (50, 0)], 0) is None, "no pair seen: unknown, never exact"
