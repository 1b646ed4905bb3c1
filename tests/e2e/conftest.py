"""Fixtures the end-to-end tests share (the root conftest's are everyone's)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from devtools.judge_server import JudgeServer
from tests.support.console_browser import browser, console
from tests.support.harness import catalog_db, worker_env

__all__ = ["browser", "console", "env"]  # the console tests' (module-scoped: a browser, the seeded API), and env


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "worker(catalog, **settings): the catalog and the SGW_* settings (by field "
                                       "name; a function of the test's ``unique`` for one named by it) of ``env``")


@pytest.fixture
async def env(request: pytest.FixtureRequest, kafka_bootstrap: str, redis_db_url: str, unique: str,
              judge: JudgeServer) -> AsyncIterator[dict[str, str]]:
    """A worker's environment: the module's ``worker`` marker's catalog in the test's own database, topics named by ``unique``, the test's judge, the marker's settings."""
    marker = request.node.get_closest_marker("worker")
    assert marker is not None, "env needs the module's pytest.mark.worker(catalog, **settings)"
    (catalog,) = marker.args
    settings = {name: value(unique) if callable(value) else value for name, value in marker.kwargs.items()}
    async with catalog_db(redis_db_url, catalog) as url:
        yield worker_env(kafka_bootstrap, url, unique, judge_base_url=judge.base_url, **settings)
