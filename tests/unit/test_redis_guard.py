"""The tests refuse a given Redis server that holds someone else's keys."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redis import Redis

from devtools.redis_servers import LocalRedis
from tests.support.redis_guard import MAY_WIPE, RedisNotOurs, refuse_foreign_keys


@pytest.fixture
def own_server() -> Iterator[str]:
    server = LocalRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


def test_a_server_holding_keys_is_refused_unless_wiping_is_allowed(own_server: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MAY_WIPE, raising=False)
    refuse_foreign_keys(own_server)  # empty: fine
    other_db = own_server.rsplit("/", 1)[0] + "/5"
    client = Redis.from_url(other_db)
    client.set("someone-elses", "data")
    client.close()
    with pytest.raises(RedisNotOurs, match=rf"db5: 1 keys.*{MAY_WIPE}=1"):
        refuse_foreign_keys(own_server)
    monkeypatch.setenv(MAY_WIPE, "1")
    refuse_foreign_keys(own_server)
