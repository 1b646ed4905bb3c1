"""Fixtures the integration tests share (the root conftest's are everyone's)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from adapters.stores.client import RedisClient
from tests.support.redis_clients import connect


@pytest.fixture
async def redis_db_client(redis_db_url: str) -> AsyncIterator[RedisClient]:
    """A client of a database that is the test's alone (``redis_db_url``), where ``redis`` is database 0's."""
    client = connect(redis_db_url)
    try:
        yield client
    finally:
        await client.aclose()
