"""Judge calls paid for work nobody claims - the playground's example, a dataset run's rows, an
alignment's cases: reserve, grade, settle, as a live pair's are (whose claim script reserves).

The one rule: nothing is graded before its judge calls are reserved from its project's window,
all or none per subject; what a verdict found in the cache pays for is not reserved again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import TracebackType

from adapters.stores.claims import Claims, PairSpend, Reservation
from consumers.batcher import Batcher
from scoring.claim_request import ClaimRequest
from scoring.panel import GroupResult
from scoring.results import cost_of, tokens_of
from scoring.verdict_cache import PairVerdicts, savings
from services.unclaimed_verdicts import UnclaimedVerdicts

RESERVE_AT_ONCE = 500  # subjects whose judge calls one Redis round trip reserves


class Spending:
    """``reserve`` subjects (by key), grade those granted with ``spends[key]``, ``settle`` them,
    then ``close`` (or ``async with``)."""

    def __init__(self, claims: Claims) -> None:
        self._claims = claims
        self._reserver: Batcher[Reservation, bool] = Batcher(claims.reserve_many)  # retries and gates, mid-grading
        self.spends: dict[str, PairSpend] = {}

    async def reserve(self, asks: Sequence[tuple[str, ClaimRequest, PairVerdicts | None]]) -> list[str]:
        """Reserve each subject's judge calls and their ceilings - less what its verdicts found pay
        for - all or none per subject; the keys granted, in order."""
        plans = []
        for key, request, found in asks:
            free_calls, free_tokens = UnclaimedVerdicts.covered(found)
            calls = max(0, request.judge_calls - free_calls) if request.judge_calls else 0
            plans.append((key, request, calls, max(0, request.judge_tokens - free_tokens) if calls else 0))
        granted: list[str] = []
        for start in range(0, len(plans), RESERVE_AT_ONCE):
            chunk = plans[start:start + RESERVE_AT_ONCE]
            now = time.time()  # the window they reserve in, and so settle in
            answers = iter(await self._claims.reserve_many(
                [Reservation(request, calls, tokens, skip_when_refused=False, at=now)
                 for _, request, calls, tokens in chunk if calls], now))
            for key, request, calls, tokens in chunk:
                if not calls or next(answers):
                    granted.append(key)
                    self.spends[key] = self._claims.spend(request, self._reserve_one, tokens,
                                                          request.cost(calls, tokens), now)
        return granted

    async def _reserve_one(self, reservation: Reservation) -> bool:
        (granted,) = await self._reserver.submit([reservation])
        return granted

    async def settle(self, graded: Sequence[tuple[str, GroupResult]],
                     verdicts: Mapping[str, PairVerdicts] | None = None) -> None:
        """The ceilings reserved brought to what the judges used and cost, and what the verdict
        cache saved counted (``verdicts``: by key), in one round trip."""
        settled, saved = [], []
        for key, result in graded:
            spend = self.spends.get(key)
            if spend is None:
                continue
            settled += spend.settlements(tokens_of(result), cost_of(result))
            spared = savings((m.outcome for m in result.blend.members), (verdicts or {}).get(key))
            if spared.hits:
                saved.append((spend.request, spared.hits, spared.tokens))
        await self._claims.mark_done([], settled=settled, saved=saved)

    async def close(self) -> None:
        await self._reserver.stop()

    async def __aenter__(self) -> Spending:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
