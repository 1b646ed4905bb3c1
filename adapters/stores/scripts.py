"""Lua scripts in a pipeline, in one round trip.

redis-py's pipeline asks ``SCRIPT EXISTS`` before every execution that holds a script: one more
round trip and one more command for every batch of claims, confirmations and history writes -
0.3 commands per judge pair, measured. Here a script goes by its SHA alone (``EVALSHA``); the
rare server that does not know it (restarted, failed over, flushed) answers that one command
with ``NOSCRIPT``, which ran nothing, and only those commands are run again with the script
loaded. The other commands of the pipeline ran once, in order, as they would have.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from adapters.stores.client import RedisClient

# Every lease is on Redis's clock, never a worker's (workers' clocks drift; Redis has one): either
# a key's expiry (LEASE below) or a deadline in milliseconds of NOW_MS, which a script that dates
# anything starts with. Dated by the caller's clock, on purpose: the delivery schedule (its entries
# are due times of retries the sender plans; a claimed entry's lease is its due time moved ahead),
# review items' times (a person's, shown), and the storage ledger's expiry (entries kept for days).
NOW_MS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# A lease held in one key (a backfill's partition, an alignment run). KEYS: the lease. ARGV: the
# holder, the lease in ms. Takes or renews it for the holder: 1, or 0 when another holds it.
LEASE = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""


class ScriptPipeline:
    """``async with ScriptPipeline(redis) as pipe``: ``pipe.script(...)`` for scripts, ``pipe.redis``
    for plain commands, ``await pipe.execute()`` for every answer in order (raising the first
    error, as a pipeline does)."""

    def __init__(self, redis: RedisClient) -> None:
        self.redis = redis.pipeline(transaction=False)
        self._scripts: list[tuple[int, AsyncScript, list[Any], list[Any]]] = []  # (index, script, keys, args)

    async def __aenter__(self) -> ScriptPipeline:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.redis.reset()  # type: ignore[no-untyped-call]

    def script(self, script: AsyncScript, keys: list[Any], args: list[Any]) -> None:
        self._scripts.append((len(self.redis), script, keys, args))
        # By name: a cluster pipeline blocks its evalsha() method, yet routes EVALSHA by its keys.
        self.redis.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)

    async def execute(self) -> list[Any]:
        replies: list[Any] = await self.redis.execute(raise_on_error=False)
        for index, script, keys, args in self._scripts:
            if isinstance(replies[index], NoScriptError):
                replies[index] = await script(keys=keys, args=args)  # loads it, then runs it
        self._scripts = []
        error = next((reply for reply in replies if isinstance(reply, Exception)), None)
        if error is not None:
            raise error
        return replies
