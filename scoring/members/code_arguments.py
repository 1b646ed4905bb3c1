"""Which of ``score(input, output, expected, spans, metadata)``'s arguments a code scorer reads.

A code scorer's arguments cross a pipe as JSON on every call, and a trace's spans are most of
them (issue 59: span documents built, encoded, sent and decoded were ~12% of a deterministic
trace's CPU, for scorers that mostly read ``output``). An argument the code never names is not
sent: the sandbox passes None in its place. Reading the code is conservative - whenever this
module cannot be sure what the code reads, it reads all five:

1. the source is at most ``MAX_READ_CHARS`` long (it is read on the event loop, once per version:
   a large one would stall it) and parses (else the sandbox reports the error, all five sent);
2. ``score`` is bound once, by a plain top-level ``def`` with five named positional parameters
   (no ``*args``/``**kwargs``, no decorator, no other assignment, import or global of it):
   the function the sandbox calls is the one read here;
3. nothing in the code can reach a frame, a namespace or an attribute by a computed name
   (``FRAME_ACCESS``: ``locals()``, ``sys``, ``inspect``, ``getattr``, any dunder...), which is how
   code reads a variable it does not name;
4. a parameter is read when a variable of its name appears anywhere in the code (a nested
   function, a lambda, an f-string) - shadowed or not: over-counting only sends an argument unread.

What a tenant gains by fooling it is nothing: an argument of its own subject, unsent.
"""

from __future__ import annotations

import ast
import functools
import re

ARGUMENTS = ("input", "output", "expected", "spans", "metadata")  # score()'s, in order
# Parsing takes ~2 ms per 1,000 characters at worst (thousands of short statements): a scorer of
# this size costs the loop ~30 ms once per version and worker; a larger one is sent everything.
MAX_READ_CHARS = 16_000
ALL_ARGUMENTS = frozenset(ARGUMENTS)

# Names and attributes through which code reaches a variable without naming it: frames and their
# namespaces, attribute access by a computed name, code evaluated from text, the modules that
# hand those out. Any dunder name or attribute counts too (``__traceback__``, ``__dict__``...).
FRAME_ACCESS = frozenset({
    "locals", "vars", "globals", "eval", "exec", "compile", "getattr", "setattr", "delattr", "breakpoint",
    "attrgetter", "methodcaller", "sys", "inspect", "traceback", "gc", "ctypes", "importlib", "builtins",
    "pdb", "bdb", "dis", "types", "faulthandler", "threading", "asyncio", "_getframe", "currentframe",
    "f_locals", "f_back", "f_globals", "f_builtins", "f_code", "tb_frame", "tb_next", "gi_frame",
    "cr_frame", "ag_frame", "frame",
})
_WORDS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@functools.lru_cache(maxsize=1024)  # once per code version (the catalog's strings: bounded as _code_key's)
def arguments_read(code: str) -> frozenset[str]:
    """The arguments (``ARGUMENTS``' names) this code scorer can read: the steps above."""
    if len(code) > MAX_READ_CHARS:  # 1.
        return ALL_ARGUMENTS
    try:
        tree = ast.parse(code)
        names, words, binds_score = _identifiers(tree)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ALL_ARGUMENTS
    score = _the_score_def(tree)  # 2.
    if score is None or binds_score != 1:
        return ALL_ARGUMENTS
    if any(word in FRAME_ACCESS or (word.startswith("__") and word.endswith("__")) for word in words):  # 3.
        return ALL_ARGUMENTS
    params = [a.arg for a in (*score.args.posonlyargs, *score.args.args)]
    return frozenset(arg for arg, param in zip(ARGUMENTS, params, strict=True) if param in names)  # 4.


def _the_score_def(tree: ast.Module) -> ast.FunctionDef | None:
    """The module's one top-level ``def score`` with exactly five named positional parameters."""
    defs = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "score"]
    if len(defs) != 1:
        return None
    (score,) = defs
    a = score.args
    if score.decorator_list or a.vararg or a.kwarg or a.kwonlyargs or len(a.posonlyargs) + len(a.args) != 5:
        return None
    return score


def _identifiers(tree: ast.Module) -> tuple[set[str], set[str], int]:
    """The variables the code names (how a parameter is read); every word it uses - names,
    attributes, imports, keywords, the words of its strings; and how many places bind ``score``."""
    names: set[str] = set()
    words: set[str] = set()
    binds_score = 0
    for node in ast.walk(tree):
        found: list[str] = []
        if isinstance(node, ast.Name):
            names.add(node.id)
            found.append(node.id)
            if node.id == "score" and not isinstance(node.ctx, ast.Load):
                binds_score += 1
        elif isinstance(node, ast.Attribute):
            found.append(node.attr)
        elif isinstance(node, ast.alias):  # ``from m import *`` may bind anything: score too
            found += [*node.name.split("."), *([node.asname] if node.asname else [])]
            binds_score += node.name == "*" or (node.asname or node.name.split(".")[0]) == "score"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            binds_score += node.name == "score"
        elif isinstance(node, ast.Global | ast.Nonlocal):
            found += node.names
            binds_score += "score" in node.names
        elif isinstance(node, ast.arg):
            binds_score += node.arg == "score"
        elif isinstance(node, ast.keyword) and node.arg is not None:
            found.append(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name is not None:
            binds_score += node.name == "score"
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name is not None:
            binds_score += node.name == "score"
        elif isinstance(node, ast.MatchMapping) and node.rest is not None:
            binds_score += node.rest == "score"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # Text names attributes too: ``"{0.__traceback__}".format(error)`` reaches a frame.
            found += _WORDS.findall(node.value)
        words.update(found)
    return names, words, binds_score
