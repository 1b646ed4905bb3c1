"""The glossary (docs/development.md, "Words"): every word names the code that is it, as
``path.py::Name``; each must be defined there, so that a rename fails here instead of leaving
the glossary naming nothing."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.source_trees import parse

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "development.md"
REFERENCE = re.compile(r"`([\w/]+\.py)::(\w+)`")


def _words() -> str:
    text = PAGE.read_text()
    return text.split("## Words", 1)[1].split("\n## ", 1)[0]


def _top_level_names(path: Path) -> set[str]:
    return {node.name for node in parse(path).body if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_word_names_code_that_is_defined_there() -> None:
    found = REFERENCE.findall(_words())
    assert len(found) >= 25, f"only {len(found)} names: was the glossary cut?"
    wrong = [f"{path}::{name}" for path, name in found
             if not (ROOT / path).is_file() or name not in _top_level_names(ROOT / path)]
    assert wrong == []


def test_a_word_is_said_once() -> None:
    rows = [line.split("|")[1].strip() for line in _words().splitlines() if line.startswith("| ") and "---" not in line]
    words = rows[1:]  # past the header
    assert len(words) == len(set(words)), sorted(w for w in words if words.count(w) > 1)
