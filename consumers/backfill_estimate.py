"""A backfill's estimate before it spends anything: ``dryRun``, the CLI's ``--estimate``, the console's Start.

The one rule: nothing is claimed, reserved or called, and an estimate is scaled by the project's own
traffic, never the shared topic's (which would tell a tenant how much the others send).
The steps: docs/design-notes.md.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition

from adapters.stores.ratings import RatingsHistory
from consumers.backfill_plan import Plan, plan_ranges
from consumers.decode import DeadLetter, decode_trace
from consumers.loop import SLICE_S
from consumers.range_reads import RangeReader, started
from scorer_groups.api_models import BackfillEstimate
from scoring.catalog import CatalogSnapshot
from scoring.judge_prompt import ANSWER_MAX_TOKENS, token_ceiling
from scoring.models import ScorerGroup
from scoring.panel import planned_judges
from scoring.prices import NANOS, UNPRICED_RATES, Pricing
from scoring.routing import group_pairs

RUN = 50  # records a run reads in a row: a seek per run, not per record
Z_95 = 1.96


async def estimate(make: Callable[[], AIOKafkaConsumer], topic: str, group: ScorerGroup, snapshot: CatalogSnapshot,
                   *, from_ms: int, to_ms: int, sample_rate: float, history: RatingsHistory, own_records: float,
                   pricing: Pricing, currency: str, limit: int, max_trace_bytes: int, max_spans: int,
                   max_judge_calls: int | None = None) -> BackfillEstimate:
    """``own_records``: the project's records in the window by its traffic index (3)."""
    traces = 0
    runs: list[tuple[int, int]] = []  # 2. per run read: the project's traces in it, the pairs they make
    ceilings: list[tuple[int, int, int | None]] = []  # per pair: its calls, token and cost ceilings (nanos)
    covered = 0  # offsets read, not records: a gap (a transaction marker) is no trace
    async with started(make) as consumer:  # one consumer of no group: assigned and moved by hand
        plan = await plan_ranges(consumer, topic, from_ms, max(from_ms, to_ms))  # 1. the job's plan
        for partition, offsets in _runs(plan, limit):
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            for start, end in offsets:
                consumer.seek(tp, start)
                reader, pairs_made, own = RangeReader(consumer, tp, end), 0, 0
                while (batch := await reader.next_batch(end - start, timeout_ms=500)) is not None:
                    slice_ends = time.monotonic() + SLICE_S
                    for record in batch:
                        if time.monotonic() > slice_ends:  # a tenant's filter never holds the API's loop
                            await asyncio.sleep(0)
                            slice_ends = time.monotonic() + SLICE_S
                        pairs = _pairs(record, topic, group, snapshot, from_ms, to_ms, sample_rate,
                                       max_trace_bytes, max_spans, pricing)
                        if pairs is not None:
                            own += 1
                            pairs_made += len(pairs)
                            ceilings += pairs
                runs.append((own, pairs_made))
                traces += own
                covered += end - start
    exact = covered >= plan.records
    return _scaled(traces if exact else max(own_records, traces), traces, runs, ceilings, history, currency,
                   max_judge_calls, exact=exact, sample_rate=sample_rate)


def _runs(plan: Plan, limit: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """Per partition, the offset runs to read: all of it when the ranges hold ``limit`` records
    or fewer, else its share of ``limit`` in runs of ``RUN`` spread evenly over its range."""
    total = plan.records
    out = []
    for r in plan.ranges:
        size = r.end - r.start
        if size <= 0:
            continue
        if total <= limit:
            out.append((r.partition, [(r.start, r.end)]))
            continue
        share = max(1, round(limit * size / total))
        runs = max(1, math.ceil(share / RUN))
        step = size / runs
        length = max(1, share // runs)
        out.append((r.partition, [(r.start + int(i * step), min(r.end, r.start + int(i * step) + length))
                                  for i in range(runs)]))
    return out


def _pairs(record: object, topic: str, group: ScorerGroup, snapshot: CatalogSnapshot, from_ms: int, to_ms: int,
           sample_rate: float, max_trace_bytes: int, max_spans: int,
           pricing: Pricing) -> list[tuple[int, int, int | None]] | None:
    """A record of the project stamped in the window: its pairs' (calls, token ceiling, cost
    ceiling), as the job would route it; None for any other record."""
    if not from_ms <= record.timestamp < to_ms:  # type: ignore[attr-defined]
        return None
    trace = decode_trace(topic, record.partition, record.offset, record.key, record.value,  # type: ignore[attr-defined]
                         max_trace_bytes)
    if isinstance(trace, DeadLetter) or trace.project_id != group.project_id:
        return None
    try:
        pairs = group_pairs(trace, group, snapshot, sample_rate=sample_rate, max_spans=max_spans, pricing=pricing)
    except Exception:  # a trace that breaks routing is graded by no job either
        return None
    out = []
    for pair in pairs:
        judges = planned_judges(group, snapshot, pair.subject)
        tokens = sum(token_ceiling(j, pair.subject) for j in judges)
        rates = pricing.rates(judges, ANSWER_MAX_TOKENS)
        out.append((len(judges), tokens, None if rates == UNPRICED_RATES else rates.cost(len(judges), tokens)))
    return out


def _scaled(own_records: float, traces: int, runs: list[tuple[int, int]],
            ceilings: list[tuple[int, int, int | None]], history: RatingsHistory, currency: str,
            max_judge_calls: int | None, *, exact: bool, sample_rate: float) -> BackfillEstimate:
    """3-4: what was read of the project, scaled to its own records in the window, with its
    error; the spend per pair."""
    pairs = sum(made for _, made in runs)
    error: float | None
    if exact:
        expected_pairs, error, scale = float(pairs), 0.0, 1.0
    elif traces:
        scale = own_records / traces
        # The index holding no more than the read saw, on a read that did not take the window
        # whole, is an index that has not counted all of it (its hours before the live loop read
        # them, or past its time): the answer is a floor, its error unknown - never 0.
        error = _error(own_records, traces, runs, pairs) if own_records > traces else None
        expected_pairs = pairs * scale
    else:  # none of its traces read: as if each of them were taken at the rate (the error unknown)
        scale, expected_pairs, error = 0.0, own_records * sample_rate, None
    spent = history.spent()
    if spent.spent and spent.judge_calls:  # the group's recent averages, per result counted with its spend
        basis = "history"
        calls = spent.judge_calls / spent.spent
        tokens = spent.tokens / spent.spent
        cost: float | None = None if spent.unpriced else spent.cost / NANOS / spent.spent
    else:  # none yet: the panel's planned calls and their ceilings - the most a pair can cost
        basis = "ceilings"
        n = len(ceilings) or 1
        calls = sum(c for c, _, _ in ceilings) / n
        tokens = sum(t for _, t, _ in ceilings) / n
        known = [m for _, _, m in ceilings if m is not None]
        cost = sum(known) / NANOS / n if len(known) == len(ceilings) else None
    judge_calls = expected_pairs * calls
    capped = max_judge_calls is not None and judge_calls > max_judge_calls
    if capped:  # the job stops at its cap: so does what it spends
        share = max_judge_calls / judge_calls  # type: ignore[operator]
        judge_calls, tokens_total = float(max_judge_calls), expected_pairs * tokens * share  # type: ignore[arg-type]
        cost_total = None if cost is None else expected_pairs * cost * share
    else:
        tokens_total, cost_total = expected_pairs * tokens, None if cost is None else expected_pairs * cost
    relative = None if error is None else (error / expected_pairs if expected_pairs else None)
    return BackfillEstimate(
        exact=exact, traces=round(traces * scale) if traces else round(own_records), pairs=round(expected_pairs),
        pairs_error=None if error is None else math.ceil(error), judge_calls=round(judge_calls),
        tokens=round(tokens_total), cost=None if cost_total is None else round(cost_total, 6), currency=currency,
        basis=basis, relative_error=None if relative is None else round(relative, 4), capped=capped)


def _error(records: float, covered: int, runs: list[tuple[int, int]], pairs: int) -> float | None:
    """The 95% error of the pairs' total over the project's ``records``, ``covered`` of them
    read in ``runs`` (the sample's units: records close together are alike - a tenant's traffic
    comes in bursts) - a ratio estimator's variance with the finite-population correction. None
    when too few runs to tell, or no pair seen: never 0 then."""
    if covered >= records:
        return 0.0
    n = len([run for run in runs if run[0]])
    if not pairs or n < 2:
        return None
    ratio = pairs / covered
    spread = sum((made - ratio * own) ** 2 for own, made in runs if own) * n / (n - 1)
    return Z_95 * records * math.sqrt(spread * (1 - covered / records)) / covered
