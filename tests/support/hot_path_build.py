"""A pytest plugin (``-p tests.support.hot_path_build`` in pyproject's addopts): the compiled hot
path (``deploy.compiled``) is built - when its sources changed since the last build - before any
conftest imports the modules it compiles, so no test runs an extension older than its source.
pytest-xdist's workers start after the controller built it: they find it fresh."""

from __future__ import annotations

from typing import Any

from deploy import compiled


def pytest_load_initial_conftests(early_config: Any, parser: Any, args: list[str]) -> None:
    compiled.build()
