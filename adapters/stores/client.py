"""The Redis client every store takes: one server's, or a Redis Cluster's.

The stores are written for both. Every key that one script, pipeline or transaction touches
together shares a hash tag (``keys.py``), so on a cluster each of them goes to one node whole;
redis-py's cluster client finds the node by the keys and follows it through a failover.

What people were promised is kept - a reviewer's label - is written on one connection and
acknowledged only once a replica has it (``one_connection``, ``OneConnection.on_a_replica``): replication is
asynchronous, and a failover loses what the primary had not yet passed on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeAlias, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError

from scoring.errors import CatalogError

RedisClient: TypeAlias = Redis | RedisCluster


class PoolBusy(RedisConnectionError):
    """Every connection of this process's pool stayed in use past the wait's deadline: the
    process drives more Redis work at once than its pool holds (``SGW_REDIS_MAX_CONNECTIONS``).
    Back-pressure, not the server's failure: the outage guard retries the step without reporting
    an outage, and the API answers 503 with Retry-After, as for any connection error."""


async def by_sha(execute: Callable[..., Awaitable[Any]], script: AsyncScript, keys: Sequence[Any],
                 args: Sequence[Any], load: Callable[[Any], Awaitable[Any]] | None = None) -> Any:
    """Run ``script`` by its SHA alone through ``execute`` (a client's, a pipeline's or a
    connection's ``execute_command``). A server that does not know it (restarted, failed over,
    flushed) answers ``NOSCRIPT``, having run nothing: the script is loaded (by ``load``, or
    through ``execute``) and run again. ``ScriptPipeline`` does the same for a pipeline's scripts."""
    try:
        return await execute("EVALSHA", script.sha, len(keys), *keys, *args)
    except NoScriptError:
        await (load(script.script) if load is not None else execute("SCRIPT", "LOAD", script.script))
        return await execute("EVALSHA", script.sha, len(keys), *keys, *args)


class NotReplicated(CatalogError):
    """503: a write people were promised is kept (a reviewer's label) reached its primary, but no
    replica acknowledged it in time: a failover now could lose it, so it is not acknowledged -
    sending it again is safe."""

    status = 503
    retriable = True


class OneConnection:
    """Commands on one pooled connection to the primary serving a key (``one_connection``): a
    write and the ``WAIT`` after it must share a connection - WAIT counts the replicas holding
    that connection's writes."""

    def __init__(self, connection: AbstractConnection) -> None:
        self._connection = connection

    async def command(self, *args: Any) -> Any:
        await self._connection.send_command(*args)
        return await self._connection.read_response()

    async def script(self, script: AsyncScript, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        return await by_sha(self.command, script, keys, args)

    async def on_a_replica(self, timeout_ms: int) -> None:
        """Return once a replica holds every write made on this connection - at once on a server
        without replicas; raise ``NotReplicated`` past ``timeout_ms``."""
        info = await self.command("INFO", "replication")
        text = info.decode() if isinstance(info, bytes) else str(info)
        replicas = next((int(line.split(":", 1)[1]) for line in text.splitlines()
                         if line.startswith("connected_slaves:")), 0)
        if replicas and int(await self.command("WAIT", 1, timeout_ms)) < 1:
            raise NotReplicated(f"no Redis replica acknowledged the write within {timeout_ms} ms; send it again")


@asynccontextmanager
async def one_connection(redis: RedisClient, key: str) -> AsyncIterator[OneConnection]:
    """One of ``redis``'s own pooled connections (its options, its pool) to the primary serving
    ``key``, for the block; dropped rather than pooled again if the block failed on it."""
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(key)
        assert node is not None, f"no node serves {key!r}"
        connection = node.acquire_connection()
        try:
            yield OneConnection(connection)
        except BaseException:
            await connection.disconnect()
            raise
        finally:
            node.release(connection)
    else:
        pool = redis.connection_pool
        standalone = cast(AbstractConnection, await pool.get_connection())  # type: ignore[no-untyped-call]
        try:
            yield OneConnection(standalone)
        except BaseException:
            await standalone.disconnect()
            raise
        finally:
            await pool.release(standalone)
