"""The tests' own databases: each holder gets one no one else holds, empty, and database 0 (the
shared one) is never handed out."""

from __future__ import annotations

import contextlib

import pytest
from redis import Redis

from devtools.redis_servers import LocalRedis
from tests.support.redis_databases import RedisDatabases


def test_each_holder_gets_an_empty_database_no_one_else_holds(own_redis: LocalRedis) -> None:
    databases = RedisDatabases(own_redis.url)
    with databases.lease() as url, contextlib.closing(Redis.from_url(url)) as client:
        client.set("left", "behind")
    with contextlib.ExitStack() as stack:
        held = [stack.enter_context(databases.lease()) for _ in range(15)]
        assert len(set(held)) == 15 and own_redis.url not in held, "15 databases, never database 0"
        assert url in held
        with contextlib.closing(Redis.from_url(url)) as client:
            assert client.dbsize() == 0, "what a holder left behind is gone"
        with pytest.raises(RuntimeError, match="every one of the 15 test databases is held"):
            stack.enter_context(databases.lease())
