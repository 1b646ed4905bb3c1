"""Metrics the hot path updates several times per trace, without a lock per update.

Exported through prometheus_client's custom-collector interface, in the same registry and format. The
one rule: ``observe`` and ``inc`` are called from one thread, the event loop; a process that updates a
metric from threads uses prometheus_client's own types instead. Why: docs/design-notes.md.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

Child = TypeVar("Child")


class _LoopFamily(Collector, Generic[Child]):
    """What both kinds share: a child per label set, made on first use, and registration."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry,
                 new_child: Callable[[], Child]) -> None:
        self._name, self._doc, self._labelnames = name, documentation, tuple(labelnames)
        self._new_child = new_child
        self._children: dict[tuple[str, ...], Child] = {}
        registry.register(self)

    def labels(self, *values: str) -> Child:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values!r}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._new_child()
        return child


class LoopHistogramChild:
    """One label set's buckets: ``counts[i]`` observations fell in bucket i alone (not cumulative)."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.total += value
        if value == value:  # NaN is in no bucket (as prometheus_client has it), only in the sum
            # bisect_left finds the first bound >= value: "le" buckets include their bound.
            self.counts[bisect_left(self._bounds, value)] += 1


class LoopHistogram(_LoopFamily[LoopHistogramChild]):
    """A histogram with labels, exposed as prometheus_client's ``Histogram`` is (``_bucket``,
    ``_count``, ``_sum``)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 buckets: Sequence[float], registry: CollectorRegistry) -> None:
        bounds = tuple(sorted(float(b) for b in buckets))
        if not bounds or bounds[-1] != math.inf:
            bounds += (math.inf,)
        self._bounds = bounds
        self._unlabelled: LoopHistogramChild | None = None
        super().__init__(name, documentation, labelnames, registry, lambda: LoopHistogramChild(bounds))

    def observe(self, value: float) -> None:
        """For a histogram without labels (its one child is looked up once)."""
        if self._unlabelled is None:
            self._unlabelled = self.labels()
        self._unlabelled.observe(value)

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for key, child in list(self._children.items()):
            running, buckets = 0, []
            for bound, count in zip(self._bounds, child.counts, strict=True):
                running += count
                buckets.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]  # as Histogram writes le
            family.add_metric(list(key), buckets, child.total)
        yield family


class LoopCounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class LoopCounter(_LoopFamily[LoopCounterChild]):
    """A counter with labels, exposed as prometheus_client's ``Counter`` is (``_total``)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), *,
                 registry: CollectorRegistry) -> None:
        super().__init__(name, documentation, labelnames, registry, LoopCounterChild)

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self._name, self._doc, labels=self._labelnames)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labelnames)
        for key, child in list(self._children.items()):
            family.add_metric(list(key), child.value)
        yield family
