"""The Redis client every store takes: one server's, or a Redis Cluster's.

The stores are written for both. Every key that one script, pipeline or transaction touches
together shares a hash tag (``keys.py``), so on a cluster each of them goes to one node whole;
redis-py's cluster client finds the node by the keys and follows it through a failover.

What people were promised is kept - a reviewer's label - is written on one connection and
acknowledged only once a replica has it (``one_connection``, ``on_a_replica``): replication is
asynchronous, and a failover loses what the primary had not yet passed on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from scoring.errors import CatalogError

RedisClient: TypeAlias = Redis | RedisCluster


class NotReplicated(CatalogError):
    """503: a write people were promised is kept (a reviewer's label) reached its primary, but no
    replica acknowledged it in time: a failover now could lose it, so it is not acknowledged -
    sending it again is safe."""

    status = 503
    retriable = True


# Of a cluster client's connection options, those a client of one of its nodes needs.
_NODE_OPTIONS = ("username", "password", "ssl", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
                 "ssl_check_hostname", "socket_timeout", "socket_connect_timeout", "credential_provider")


@asynccontextmanager
async def one_connection(redis: RedisClient, key: str) -> AsyncIterator[Redis]:
    """A client on one connection to the primary serving ``key``: a write and the ``WAIT`` after
    it must share a connection (WAIT counts the replicas holding that connection's writes)."""
    if isinstance(redis, RedisCluster):
        node = redis.get_node_from_key(key)
        assert node is not None, f"no node serves {key!r}"
        options = {k: v for k, v in redis.nodes_manager.connection_kwargs.items() if k in _NODE_OPTIONS}
        client = Redis(host=node.host, port=int(node.port), single_connection_client=True, **options)
    else:
        client = redis.client()
    async with client:
        yield client


async def on_a_replica(client: Redis, timeout_ms: int) -> None:
    """Return once a replica of ``client``'s server holds every write made on its connection -
    at once on a server without replicas; raise ``NotReplicated`` past ``timeout_ms``."""
    replication = await client.info("replication")
    if int(replication.get("connected_slaves", 0)) and await client.wait(1, timeout_ms) < 1:
        raise NotReplicated(f"no Redis replica acknowledged the write within {timeout_ms} ms; send it again")
