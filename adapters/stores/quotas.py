"""A project's quotas on what it keeps: datasets, evaluation runs, alignment runs, and their bytes.

Checked and taken in one step: ``reserve`` is one script on the project's keys that counts what
the project keeps (datasets and their bytes, runs and their sizes, the entries of its storage
ledger) and, when the addition fits, records it in the ledger - so two creates at the same moment
can never both take the last place. A reservation for a document that is then written (a
dataset, a version, a run) is released in the write's own transaction, when the document counts
for itself; an alignment run lives in the ledger for as long as the run is kept (its document is
under the judge's key, elsewhere on a cluster). A run grows when it is finalized: its bytes
count from then on, so the next create is refused, never a finalize whose judges were paid for.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Literal

from adapters.stores import keys
from adapters.stores.client import RedisClient
from adapters.stores.datasets import DatasetStore
from adapters.stores.evaluations import EvaluationStore
from scoring.errors import QuotaExceeded
from scoring.frozen import frozen

Kind = Literal["dataset", "version", "run", "alignment"]  # what a reservation adds

# A reservation that is never released (its process died between reserving and writing) stops
# counting after this long: long enough for the largest upload's write.
PENDING_S = 300


@frozen
class Quotas:
    datasets: int  # SGW_MAX_DATASETS_PER_PROJECT
    runs: int  # SGW_MAX_EVALUATION_RUNS_PER_PROJECT: runs kept (not expired)
    stored_bytes: int  # SGW_MAX_PROJECT_STORED_BYTES: everything above, together
    alignments: int = 100  # SGW_MAX_ALIGNMENT_RUNS_PER_PROJECT: alignment runs kept

    def count_of(self, kind: Kind) -> tuple[str, str, int] | None:
        """(setting, noun, limit) of the count quota ``kind`` is held to; None: bytes only."""
        if kind == "dataset":
            return "SGW_MAX_DATASETS_PER_PROJECT", "datasets", self.datasets
        if kind == "run":
            return ("SGW_MAX_EVALUATION_RUNS_PER_PROJECT", f"evaluation runs (a run is kept "
                    f"{keys.EVALUATION_TTL_S // 86_400} days after its last change)", self.runs)
        if kind == "alignment":
            return ("SGW_MAX_ALIGNMENT_RUNS_PER_PROJECT", f"alignment runs (a run is kept "
                    f"{keys.ALIGNMENT_TTL_S // 86_400} days after its last change)", self.alignments)
        return None


# Count what the project keeps and, unless ARGV[9] is "check", record the addition - one step.
# KEYS: the ledger, the datasets' hash, their bytes, the runs' sizes (all on the project's tag).
# ARGV: now, token, kind, bytes, expires at, count limit (-1: none), bytes limit, counted kind
# for the datasets' hash ("dataset") or the runs' sizes ("run"), "check" or "take".
# The ledger: field token -> "<kind> <expires at> <bytes>"; expired entries are dropped here.
# Answers {0} when taken, {1, used} past the count quota, {2, used} past the bytes quota.
_RESERVE = """
local now, token, kind = tonumber(ARGV[1]), ARGV[2], ARGV[3]
local adding, count_limit, bytes_limit = tonumber(ARGV[4]), tonumber(ARGV[6]), tonumber(ARGV[7])
local count, stored = 0, tonumber(redis.call('GET', KEYS[3]) or '0')
if kind == 'dataset' then count = redis.call('HLEN', KEYS[2]) end
local sizes = redis.call('HGETALL', KEYS[4])
for i = 1, #sizes, 2 do
  local expires, size = string.match(sizes[i + 1], '(%S+) (%S+)')
  if expires and tonumber(expires) > now then
    stored = stored + tonumber(size)
    if kind == 'run' then count = count + 1 end
  end
end
local ledger = redis.call('HGETALL', KEYS[1])
for i = 1, #ledger, 2 do
  local what, expires, size = string.match(ledger[i + 1], '(%S+) (%S+) (%S+)')
  if not expires or tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], ledger[i])
  elseif ledger[i] ~= token then
    stored = stored + tonumber(size)
    if what == kind then count = count + 1 end
  end
end
if count_limit >= 0 and count >= count_limit then return {1, count} end
if stored + adding > bytes_limit or stored >= bytes_limit then return {2, stored} end
if ARGV[9] == 'take' then
  redis.call('HSET', KEYS[1], token, kind .. ' ' .. ARGV[5] .. ' ' .. ARGV[4])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[8]))
end
return {0}
"""
LEDGER_TTL_S = keys.ALIGNMENT_TTL_S + 86_400  # the ledger outlives its longest entry


class ProjectStorage:
    """What a project keeps, counted against its ``Quotas`` in one step with what it adds."""

    def __init__(self, redis: RedisClient, quotas: Quotas) -> None:
        self._redis, self._quotas = redis, quotas
        self._reserve = redis.register_script(_RESERVE)

    async def check(self, project_id: str, kind: Kind, adding_bytes: int = 0) -> None:
        """Refuse (``QuotaExceeded``) what would take the project past a quota, taking nothing:
        the early answer before an upload is read."""
        await self._counted(project_id, "", kind, adding_bytes, 0, take=False)

    async def reserve(self, project_id: str, kind: Kind, adding_bytes: int, *, token: str | None = None,
                      keep_s: int = PENDING_S) -> str:
        """Take room for ``adding_bytes`` more of ``kind``, or refuse; the reservation's token."""
        token = token or f"{kind}:{uuid.uuid4().hex}"
        await self._counted(project_id, token, kind, adding_bytes, keep_s, take=True)
        return token

    async def release(self, project_id: str, token: str) -> None:
        await self._redis.hdel(keys.project_storage(project_id), token)

    @asynccontextmanager
    async def reserved(self, project_id: str, kind: Kind, adding_bytes: int) -> AsyncIterator[str]:
        """Room for a write made in the block, named by the token it yields: the write gives it
        back in its own transaction (the document then counts for itself, never twice); this
        gives it back too, after the block - a no-op then, the room back when the write failed."""
        token = await self.reserve(project_id, kind, adding_bytes)
        try:
            yield token
        finally:
            await self.release(project_id, token)

    async def _counted(self, project_id: str, token: str, kind: Kind, adding_bytes: int, keep_s: int, *,
                       take: bool) -> None:
        await DatasetStore(self._redis).usage(project_id)  # counts the bytes of datasets kept before the counter
        await EvaluationStore(self._redis).sizes(project_id)  # forgets expired runs, indexes older ones
        count = self._quotas.count_of(kind)
        reply = await self._reserve(
            keys=[keys.project_storage(project_id), keys.datasets(project_id), keys.dataset_bytes(project_id),
                  keys.evaluation_sizes(project_id)],
            args=[time.time(), token, kind, adding_bytes, time.time() + keep_s, count[2] if count else -1,
                  self._quotas.stored_bytes, LEDGER_TTL_S, "take" if take else "check"])
        answer, used = int(reply[0]), int(reply[1]) if len(reply) > 1 else 0
        if answer == 1 and count is not None:
            raise QuotaExceeded(count[0], count[1], used, count[2])
        if answer == 2:
            raise QuotaExceeded("SGW_MAX_PROJECT_STORED_BYTES",
                                f"bytes of datasets, evaluation and alignment runs (adding {adding_bytes:,})",
                                used, self._quotas.stored_bytes)


def ledger_entry(kind: Kind, keep_s: int, size: int) -> str:
    """A ledger entry as ``_RESERVE`` reads it (what a kept document records as it changes)."""
    return f"{kind} {time.time() + keep_s} {size}"
