"""A dataset run's judge calls, reserved from its project's judge budget as a live pair's are.

Before a finalize grades, each row's judge calls - and, under a token budget, their token
ceiling - are reserved from the project's budget window, all or none per row, in chunks of rows
(one Redis round trip a chunk): a row without room is not graded, never graded on a partial
panel, and the run names it (``budgetSkippedRows``). What a row decides while it is graded - a
judge retry, a gates-first group's judges once its cheap gates passed - reserves as a live
pair's does, the rows' reservations batched together. Once the rows are graded, the window's
tokens are settled to the usage the judges reported, in one round trip.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from adapters.stores.claims import Claims, PairSpend, Reservation
from consumers.batcher import Batcher
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import day_of
from scoring.dataset import DatasetRow, DatasetRun, GradingPlan
from scoring.prices import NO_PRICING, Pricing
from scoring.results import cost_of, tokens_of
from scoring.routing import pair_of
from scoring.verdict_cache import PairVerdicts, savings
from services.unclaimed_verdicts import UnclaimedVerdicts

RESERVE_ROWS = 500  # rows whose judge calls one Redis round trip reserves


class RunSpend:
    """One finalize's share of its project's judge budget: ``reserve`` the rows, grade them with
    ``spends``, ``settle``, then ``close``."""

    def __init__(self, claims: Claims, run_id: str, plan: GradingPlan, catalog: CatalogSnapshot,
                 pricing: Pricing = NO_PRICING) -> None:
        self._claims, self._run_id, self._group, self._catalog = claims, run_id, plan.group, catalog
        self._pricing = pricing
        self._reserver: Batcher[Reservation, bool] = Batcher(claims.reserve_many)
        self.spends: dict[str, PairSpend] = {}  # by row id: the rows whose calls were reserved

    async def reserve(self, rows: list[DatasetRow],
                      verdicts: Mapping[str, PairVerdicts] | None = None) -> list[DatasetRow]:
        """The rows whose judge calls were reserved, in order; the others found no room. A row's
        calls whose verdicts were paid for already, or are paid for by another row (``verdicts``,
        by row id: ``services.unclaimed_verdicts``), are not reserved."""
        day = day_of(time.time())
        claims = [pair_of(self._group, row.subject(self._group.project_id), self._catalog,
                          subject_key=f"evaluation:{self._run_id}:{row.id}", day=day, pricing=self._pricing).claim
                  for row in rows]
        asks: list[tuple[int, int]] = []  # (calls, tokens) each row reserves
        for row, claim in zip(rows, claims, strict=True):
            free_calls, free_tokens = UnclaimedVerdicts.covered((verdicts or {}).get(str(row.id)))
            calls = max(0, claim.judge_calls - free_calls) if claim.judge_calls else 0
            asks.append((calls, max(0, claim.judge_tokens - free_tokens) if calls else 0))
        granted: list[DatasetRow] = []
        for start in range(0, len(rows), RESERVE_ROWS):
            chunk = list(zip(rows[start:start + RESERVE_ROWS], claims[start:start + RESERVE_ROWS],
                             asks[start:start + RESERVE_ROWS], strict=True))
            asking = [Reservation(c, calls, tokens, skip_when_refused=False)
                      for _, c, (calls, tokens) in chunk if calls]
            now = time.time()  # the window they reserve in, and so settle in
            answers = iter(await self._claims.reserve_many(asking, now))
            for row, claim, (calls, tokens) in chunk:
                if not calls or next(answers):
                    granted.append(row)
                    self.spends[str(row.id)] = self._claims.spend(claim, self._reserve_one, tokens,
                                                                  claim.cost(calls, tokens), now)
        return granted

    async def _reserve_one(self, reservation: Reservation) -> bool:
        (granted,) = await self._reserver.submit([reservation])
        return granted

    async def settle(self, graded: DatasetRun, verdicts: Mapping[str, PairVerdicts] | None = None) -> None:
        """The window's tokens settled to what the judges reported (less the ceilings reserved),
        and what the verdict cache saved the rows counted (``verdicts``: by row id)."""
        settled, saved = [], []
        for r in graded.rows:
            spend = self.spends.get(str(r.row.id))
            if spend is None:
                continue
            settled += spend.settlements(tokens_of(r.result), cost_of(r.result))
            spared = savings((m.outcome for m in r.result.blend.members), (verdicts or {}).get(str(r.row.id)))
            if spared.hits:
                saved.append((spend.request, spared.hits, spared.tokens))
        await self._claims.mark_done([], settled=settled, saved=saved)

    async def close(self) -> None:
        await self._reserver.stop()
