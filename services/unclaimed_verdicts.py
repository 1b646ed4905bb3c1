"""The verdict cache (``scoring.verdict_cache``) for work that claims nothing - the rows of a
dataset run, a playground example - as the pair protocol's claim does it for live traffic:

1. ``look_up``: every subject's judge keys read at once (one MGET), before any budget is asked;
   a key found is a hit, and of the subjects sharing a key not found the first pays for it (its
   ``reserved``), the others wait on its call;
2. the caller reserves the judge calls less ``covered`` ones, and grades with the verdicts;
3. ``keep``: the verdicts the grading paid for, written for the next run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from adapters.stores.verdicts import Paid, VerdictStore
from scoring.catalog import CatalogSnapshot
from scoring.models import ScorerGroup
from scoring.panel import Panel, defers_judges
from scoring.subjects import Subject
from scoring.verdict_cache import CachedVerdict, PairVerdicts

LOOKUP_CHUNK = 1_000  # keys per MGET: a 10,000-row run is ten commands in one round trip


class UnclaimedVerdicts:
    def __init__(self, panel: Panel, store: VerdictStore | None) -> None:
        self._panel = panel
        self._store = store if panel.verdict_cache is not None else None

    async def look_up(self, group: ScorerGroup, snapshot: CatalogSnapshot,
                      subjects: Sequence[tuple[str, str, Subject]]) -> dict[str, PairVerdicts]:
        """Per subject - (its name, the rating id it is published under, the subject) - what the
        cache holds for its judges, by name; {} when the cache is off."""
        if self._store is None:
            return {}
        found: dict[str, PairVerdicts] = {}
        for name, rating_id, subject in subjects:
            verdicts = found[name] = PairVerdicts()
            verdicts.rating_id = rating_id
            # the messages are built again at call time: a run's every prompt is never held at once
            verdicts.keys = {k.judge_id: replace(k, messages=[])
                             for k in self._panel.verdict_keys(group, snapshot, subject)}
        wanted = list(dict.fromkeys(k.key for v in found.values() for k in v.keys.values()))
        stored: dict[str, CachedVerdict] = {}
        for start in range(0, len(wanted), LOOKUP_CHUNK):
            stored.update(await self._store.lookup(group.project_id, wanted[start:start + LOOKUP_CHUNK]))
        flights, paying = self._panel.flights, set()
        upfront = not defers_judges(group)  # a gates-first group reserves its calls once its gates passed
        for verdicts in found.values():
            for key in verdicts.keys.values():
                hit = stored.get(key.key) or flights.known(key.key)
                if hit is not None:
                    verdicts.hits[key.key] = hit
                elif upfront and key.key not in paying and not flights.flying(key.key):
                    paying.add(key.key)
                    verdicts.reserved.add(key.key)
        return found

    @staticmethod
    def covered(verdicts: PairVerdicts | None) -> tuple[int, int]:
        """The judge calls (and their token ceilings) a subject need not reserve: its keys paid
        for already, or by another subject's call."""
        if verdicts is None:
            return 0, 0
        free = [k for k in verdicts.keys.values() if k.key not in verdicts.reserved]
        return len(free), sum(k.tokens for k in free)

    async def keep(self, project_id: str, graded: Iterable[PairVerdicts]) -> int:
        """Write the verdicts the grading paid for; how many."""
        if self._store is None:
            return 0
        paid = [Paid(project_id, key, verdict) for verdicts in graded for key, verdict in verdicts.fresh.items()]
        return len(await self._store.store(paid)) if paid else 0
