"""The map of the house (docs/development.md, "A map of the house") names files and the
functions, classes and methods in them: every one must exist, so that a rename or a removal
fails here instead of leaving the map pointing at nothing.

A reference is a backticked ``path`` or ``path.py::Name`` / ``path.py::Class.method``. In the
features table a cell's paths are under its column's folder (the header's backticked path);
everywhere else in the section a path is whole, from the repository's root (a bare
``traces.py`` there names a file at the root, and fails). Names are looked up in the file's
syntax tree (``ast``), never by importing it.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.support.source_trees import parse

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "development.md"
SECTION = "## A map of the house"
FLOORS = ("deploy/", "devtools/", "worker/", "services/", "consumers/", "adapters/", "scoring/", "sdk/")
FEATURES = (
    "Live trace scoring", "Session scoring", "Span scope", "Filters and routing", "Sampling",
    "Budgets and claims", "The outbox and publishing", "Webhooks and alert channels", "Incidents",
    "Digests", "The fleet's shared background work", "The catalog", "Backfills",
    "Dataset runs and evaluations", "The playground", "Judge call records and their OTLP export",
    "OTLP intake", "The code-scorer sandbox", "The HTTP API and console", "The CLI",
    "Review queues", "Judges that learn", "The verdict cache",
    "Spend in money",
)
CODE = re.compile(r"`([^`]+)`")
# A file's path (at least a name with an extension), optionally followed by ::Dotted.Name.
REFERENCE = re.compile(r"^(?P<path>[\w./-]*\w\.[A-Za-z]+)(?:::(?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))?$")


def _section() -> str:
    text = PAGE.read_text()
    assert SECTION in text, f"{PAGE.relative_to(ROOT)} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    following = re.search(r"^## ", body, flags=re.MULTILINE)
    return body[:following.start()] if following else body


def _table_rows(section: str) -> tuple[list[str], list[list[str]]]:
    """The features table: its header's cells and each row's cells."""
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) > 2, "the map has no features table"
    cells = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines]
    header, rows = cells[0], cells[2:]
    for row in rows:
        assert len(row) == len(header), f"a row of {len(row)} cells under {len(header)} columns: {row[0]}"
    return header, rows


def references() -> list[tuple[str, str | None, str]]:
    """Every (path from the root, name or None, where it was written) the map section holds."""
    section = _section()
    found: list[tuple[str, str | None, str]] = []
    header, rows = _table_rows(section)
    folders = [(CODE.findall(cell) or [""])[0] for cell in header]
    for row in rows:
        for folder, cell in zip(folders[1:], row[1:], strict=True):
            for code in CODE.findall(cell):
                match = REFERENCE.match(code)
                if match is None:  # a setting's name, a note
                    continue
                found.append((folder + match["path"], match["name"], f"{row[0]} / {folder}"))
    prose = "\n".join(line for line in section.splitlines() if not line.startswith("|"))
    for code in CODE.findall(prose):
        match = REFERENCE.match(code)
        if match is None:
            continue
        found.append((match["path"], match["name"], "the text"))
    return found


@cache
def _defined(path: str) -> frozenset[str]:
    """The dotted names a Python file defines: its top-level functions, classes and assigned
    names, and - for each class, nested ones too - the functions and attributes in its body."""
    tree = parse(ROOT / path)
    names: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(prefix + node.name)
            elif isinstance(node, ast.ClassDef):
                names.add(prefix + node.name)
                walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.Assign):
                names.update(prefix + t.id for t in node.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(prefix + node.target.id)
            elif isinstance(node, (ast.If, ast.Try)) and not prefix:  # guarded top-level definitions
                walk(node.body + getattr(node, "orelse", []), prefix)

    walk(tree.body, "")
    return frozenset(names)


def test_the_map_names_every_floor_and_every_feature() -> None:
    section = _section()
    floors = section.split("### ", 2)[1]
    for floor in FLOORS:
        assert f"`{floor}`" in floors, f"the floors do not name {floor}"
    _, rows = _table_rows(section)
    assert [row[0] for row in rows] == list(FEATURES)
    assert re.search(r"^### The walk of one trace from record to commit$", section, flags=re.MULTILINE)


def test_every_file_the_map_names_exists() -> None:
    found = references()
    assert len(found) > 200, f"only {len(found)} references: was the map cut?"
    missing = sorted({f"{path} ({where})" for path, _, where in found if not (ROOT / path).is_file()})
    assert not missing, "the map names files that do not exist:\n" + "\n".join(missing)


def test_every_function_class_and_method_the_map_names_is_defined_where_it_says() -> None:
    named = [(path, name, where) for path, name, where in references() if name is not None]
    assert len(named) > 100, f"only {len(named)} named definitions: was the map cut?"
    wrong = []
    for path, name, where in named:
        if not path.endswith(".py"):
            wrong.append(f"{path}::{name} ({where}): only a Python file's names can be checked")
        elif (ROOT / path).is_file() and name not in _defined(path):
            wrong.append(f"{path}::{name} ({where})")
    assert not wrong, "the map names what is not defined there:\n" + "\n".join(sorted(set(wrong)))


def test_the_walk_points_at_the_code_step_by_step() -> None:
    walk = _section().split("### The walk of one trace from record to commit", 1)[1]
    steps = re.findall(r"^\d+\. \*\*", walk, flags=re.MULTILINE)
    assert len(steps) >= 10
    for step in re.split(r"^\d+\. ", walk, flags=re.MULTILINE)[1:]:
        assert re.search(r"`[\w/]+\.py::\w", step), f"a step that points at no code: {step[:80]!r}"


def test_kafka_is_polled_in_the_two_modules_that_say_so() -> None:
    """Consuming (a group's partitions, ``consumers/loop.py``) and reading back a fixed
    range (no group, ``consumers/range_reads.py``) are the two ways the service reads Kafka; a
    third poll elsewhere in the service is a concept said twice. (``devtools/demo.py`` tails the
    output topics for a person watching the demo: not the service.)"""
    polling: set[str] = set()
    for floor in ("consumers", "worker", "services", "adapters", "scoring"):
        for path in sorted((ROOT / floor).rglob("*.py")):
            for node in ast.walk(parse(path)):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("getmany", "getone")):
                    polling.add(str(path.relative_to(ROOT)))
    assert polling == {"consumers/loop.py", "consumers/range_reads.py"}, sorted(polling)
