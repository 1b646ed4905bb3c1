"""The suite's own layout: what tests share lives in tests/support, so no test file imports
another (a helper moved or renamed in one test file must not break a second one)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.source_trees import parse

TESTS = Path(__file__).resolve().parents[1]


def test_no_test_file_imports_another() -> None:
    found = []
    for path in TESTS.rglob("test_*.py"):
        for node in ast.walk(parse(path)):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{path.relative_to(TESTS)} imports {name}" for name in names
                      if name.startswith("tests.") and name.rsplit(".", 1)[-1].startswith("test_")]
    assert found == []
