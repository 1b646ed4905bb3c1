"""A dataset run's judge calls, reserved from its project's judge budget before its rows are
graded (``services.spending``): a row without room is not graded, never on a partial panel, and
the run names it (``budgetSkippedRows``)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from adapters.stores.claims import Claims
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import day_of
from scoring.dataset import DatasetRow, DatasetRun, GradingPlan
from scoring.prices import NO_PRICING, Pricing
from scoring.routing import pair_of
from scoring.verdict_cache import PairVerdicts
from services.spending import Spending


class RunSpend:
    """One finalize's share of its project's judge budget (``services.spending``): ``reserve``
    the rows, grade them with ``spends``, ``settle``, then ``close``."""

    def __init__(self, claims: Claims, run_id: str, plan: GradingPlan, catalog: CatalogSnapshot,
                 pricing: Pricing = NO_PRICING) -> None:
        self._run_id, self._group, self._catalog, self._pricing = run_id, plan.group, catalog, pricing
        self._spending = Spending(claims)
        self.spends = self._spending.spends  # by row id: the rows whose calls were reserved

    async def reserve(self, rows: list[DatasetRow],
                      verdicts: Mapping[str, PairVerdicts] | None = None) -> list[DatasetRow]:
        """The rows whose judge calls were reserved, in order; the others found no room. A row's
        calls whose verdicts were paid for already, or are paid for by another row (``verdicts``,
        by row id: ``services.unclaimed_verdicts``), are not reserved."""
        day = day_of(time.time())
        asks = [(str(row.id), pair_of(self._group, row.subject(self._group.project_id), self._catalog,
                                      subject_key=f"evaluation:{self._run_id}:{row.id}", day=day,
                                      pricing=self._pricing).claim, (verdicts or {}).get(str(row.id)))
                for row in rows]
        granted = set(await self._spending.reserve(asks))
        return [row for row in rows if str(row.id) in granted]

    async def settle(self, graded: DatasetRun, verdicts: Mapping[str, PairVerdicts] | None = None) -> None:
        """The window's tokens settled to what the judges reported (less the ceilings reserved),
        and what the verdict cache saved the rows counted (``verdicts``: by row id)."""
        await self._spending.settle([(str(r.row.id), r.result) for r in graded.rows], verdicts)

    async def close(self) -> None:
        await self._spending.close()
