"""A source file's syntax tree, for tests that read the code without importing it.

Parsed in a thread of its own: CPython 3.11's parser keeps a recursion counter per thread, and
after a RecursionError elsewhere in the same thread (a test of deeply nested input) it refuses
the next parse with "AST constructor recursion depth mismatch" - a suite-order accident, not
anything about the file.
"""

from __future__ import annotations

import ast
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def parse(path: Path) -> ast.Module:
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(ast.parse, path.read_text(), str(path)).result()
