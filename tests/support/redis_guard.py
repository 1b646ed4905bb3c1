"""Tests and benchmarks empty Redis databases (FLUSHDB). On a server they did not start, they
first make sure nothing there is someone else's: a server holding keys is refused unless
SGW_TESTS_MAY_WIPE_REDIS=1 says its data may be lost."""

from __future__ import annotations

import os

from redis import Redis

MAY_WIPE = "SGW_TESTS_MAY_WIPE_REDIS"


class RedisNotOurs(RuntimeError):
    """The given Redis server holds keys this run did not create."""


def refuse_foreign_keys(redis_url: str) -> None:
    """Raise unless every database of the server at ``redis_url`` is empty (or wiping is allowed)."""
    if os.environ.get(MAY_WIPE) == "1":
        return
    client = Redis.from_url(redis_url, socket_timeout=5)
    try:
        keyspace = client.info("keyspace")
    finally:
        client.close()
    holding = {db: stats["keys"] for db, stats in keyspace.items() if stats.get("keys")}
    if holding:
        found = ", ".join(f"{db}: {keys} keys" for db, keys in sorted(holding.items()))
        raise RedisNotOurs(
            f"the Redis server at SGW_REDIS_URL holds keys ({found}); the tests empty databases on it "
            f"(FLUSHDB). Point SGW_REDIS_URL at an empty server, or set {MAY_WIPE}=1 if its data may be lost.")
