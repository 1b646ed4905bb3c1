"""Databases of the shared Redis server, handed to tests one holder at a time.

A test that writes global keys - the catalog, API keys, a worker's state - gets a database no
other test holds, emptied when it is handed out and when it is given back, so what one test
leaves behind is never seen by another, whatever order they run in. Database 0 is handed to
no one: tests there share it and keep apart by naming their keys uniquely (``unique``).

A Redis Cluster has database 0 alone, so on a cluster run (``RedisClusters``) a holder gets a
cluster of its own instead: small ones (three primaries), started when every one is held and
kept for the next holder.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from redis import Redis
from redis.exceptions import ResponseError

from devtools.redis_servers import LocalRedisCluster

DEFAULT_DATABASES = 16  # Redis's own default, when the server will not say (CONFIG refused)


class RedisDatabases:
    """``share``: (index, count) when ``count`` test processes (pytest-xdist workers) lease from
    one server: each takes the databases ``db`` with ``(db - 1) % count == index``."""

    def __init__(self, server_url: str, share: tuple[int, int] = (0, 1)) -> None:
        self._base = server_url.rsplit("/", 1)[0]
        index, count = share
        self._mine = [db for db in range(1, _databases(server_url)) if (db - 1) % count == index]
        self._held: set[int] = set()
        self._turn = 0

    @contextlib.contextmanager
    def lease(self) -> Iterator[str]:
        """The URL of a database of the caller's own, empty, for the duration of the block."""
        db = self._take()
        url = f"{self._base}/{db}"
        _empty(url)
        try:
            yield url
        finally:
            _empty(url)
            self._held.discard(db)

    def _take(self) -> int:
        # In turn, not lowest first: a database goes back into use as late as possible.
        for _ in range(len(self._mine)):
            db = self._mine[self._turn % len(self._mine)]
            self._turn += 1
            if db not in self._held:
                self._held.add(db)
                return db
        raise RuntimeError(f"every one of the {len(self._mine)} test databases is held")


class RedisClusters:
    """``lease()`` as ``RedisDatabases``'s, handing out whole clusters."""

    def __init__(self) -> None:
        self._free: list[LocalRedisCluster] = []
        self._all: list[LocalRedisCluster] = []

    @contextlib.contextmanager
    def lease(self) -> Iterator[str]:
        cluster = self._free.pop() if self._free else self._started()
        cluster.flush()
        try:
            yield cluster.url
        finally:
            cluster.flush()
            self._free.append(cluster)

    def _started(self) -> LocalRedisCluster:
        cluster = LocalRedisCluster(primaries=3, replicas_each=0).start()
        self._all.append(cluster)
        return cluster

    def stop(self) -> None:
        for cluster in self._all:
            cluster.stop()


def _databases(server_url: str) -> int:
    with contextlib.closing(Redis.from_url(server_url, socket_timeout=5)) as client:
        try:
            return int(client.config_get("databases")["databases"])
        except (ResponseError, KeyError):
            return DEFAULT_DATABASES


def _empty(url: str) -> None:
    with contextlib.closing(Redis.from_url(url, socket_timeout=5)) as client:
        client.flushdb()
