"""Which of ``score(input, output, expected, spans, metadata)``'s arguments a code scorer reads.

An argument the code never names is not sent: the sandbox passes None in its place. The one rule: the
reading is conservative - unless every rule holds, all five are sent - and a scorer never gets anything
but its own subject's arguments. The rules and why: docs/design-notes.md; the attacks they hold against:
tests/unit/test_code_arguments.py.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import types
import unicodedata

ARGUMENTS = ("input", "output", "expected", "spans", "metadata")  # score()'s, in order
ALL_ARGUMENTS = frozenset(ARGUMENTS)
# Parsing and walking take up to ~3.5 ms per 1,000 characters (thousands of one-word statements):
# a scorer of this size (~80 lines) costs the loop ~10 ms at worst, once per version and worker.
MAX_READ_CHARS = 3_000

# Modules a scorer may import and still be read: none hands out frames, evaluates text or reads
# attributes by a computed name (``string``'s Formatter, ``functools.update_wrapper``, ``typing``,
# ``pickle``, ``operator`` and ``inspect`` all do). What they import themselves is reached only
# through private attributes (refused below) or words of FRAME_ACCESS (``sys``).
PLAIN_MODULES = frozenset({
    "re", "math", "json", "difflib", "statistics", "collections", "itertools", "unicodedata", "datetime",
    "decimal", "fractions", "textwrap", "heapq", "bisect", "random",
})


def _public_names(module_name: str) -> frozenset[str]:
    """What a plain module offers: its ``__all__`` (else its public names), never a module."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
    return frozenset(n for n in names if not isinstance(getattr(module, n, None), types.ModuleType))


MODULE_NAMES = {name: _public_names(name) for name in PLAIN_MODULES}
# Words that reach a variable, a frame, a module or an attribute without naming them.
FRAME_ACCESS = frozenset({
    "locals", "vars", "globals", "eval", "exec", "compile", "getattr", "setattr", "delattr", "breakpoint",
    "type", "attrgetter", "methodcaller", "update_wrapper", "wraps", "Formatter", "vformat", "get_field",
    "format_map", "sys", "inspect", "traceback", "gc", "ctypes", "importlib", "builtins", "pickle", "marshal",
    "pdb", "bdb", "dis", "types", "typing", "faulthandler", "threading", "asyncio", "stack", "getargvalues",
    "resolve_name", "locate", "modules", "_getframe", "currentframe", "f_locals", "f_back", "f_globals",
    "f_builtins", "f_code", "tb_frame", "tb_next", "gi_frame", "cr_frame", "ag_frame", "frame",
    # types and code objects (a function rebuilt with other names), annotations evaluated,
    # the process's own memory, the modules the plain ones import
    "mro", "object", "FunctionType", "CodeType", "LambdaType", "MethodType", "gi_code", "cr_code", "ag_code",
    "co_code", "ABCMeta", "EnumMeta", "EnumType", "singledispatch", "singledispatchmethod",
    "get_type_hints", "open", "help", "memoryview", "functools", "enum", "bltns", "operator", "codecs",
    "copyreg", "os",
})
_WORDS = re.compile(r"[^\W\d]\w*")  # identifier-like words, any script


class _Unsure(Exception):
    """The code might read an argument without naming it: send all five."""


@functools.lru_cache(maxsize=1024)  # once per code version (the catalog's strings: bounded as _code_key's)
def arguments_read(code: str) -> frozenset[str]:
    """The arguments (``ARGUMENTS``' names) this code scorer can read: the steps above."""
    if len(code) > MAX_READ_CHARS:  # 1.
        return ALL_ARGUMENTS
    try:
        tree = ast.parse(code)
        names, binds_score = _variables(tree)  # 3.
    except Exception:  # _Unsure, or what parsing a hostile text raises (SyntaxError, RecursionError...)
        return ALL_ARGUMENTS
    score = _the_score_def(tree)  # 2.
    if score is None or binds_score != 1:
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


def _variables(tree: ast.Module) -> tuple[set[str], int]:
    """One walk: the variables the code names and how many places bind ``score``; raises
    ``_Unsure`` at the first thing step 3 refuses."""
    names: set[str] = set()
    binds_score = 0
    modules: dict[str, str] = {}  # the names imported modules go by -> the module
    name_nodes: list[ast.Name] = []
    module_uses: list[tuple[ast.Name, str]] = []  # ``module.attribute``: the name, the attribute
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            _word(node.id)
            names.add(node.id)
            name_nodes.append(node)
            binds_score += node.id == "score" and not isinstance(node.ctx, ast.Load)
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name):
                module_uses.append((node.value, node.attr))
            if node.attr.startswith("_"):  # a module's private imports (collections._sys), mangled names
                raise _Unsure
            if node.attr in ("format", "vformat") and not (
                    isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
                raise _Unsure  # a format string built at run time names attributes of its arguments
            _word(node.attr)
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str | bytes):
                text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
                for word in _WORDS.findall(unicodedata.normalize("NFKC", text)):
                    _word(word)
        elif isinstance(node, ast.Import):
            for alias in node.names:  # ``import re`` or ``import re as r``: a plain module, whole
                if alias.name not in PLAIN_MODULES:
                    raise _Unsure
                bound = alias.asname or alias.name
                _word(bound)
                modules[bound] = alias.name
                binds_score += bound == "score"
        elif isinstance(node, ast.ImportFrom):
            if node.level or node.module not in PLAIN_MODULES:
                raise _Unsure  # relative, a submodule or another module
            for alias in node.names:  # ``*`` may bind anything, score too; a module is refused
                if alias.name not in MODULE_NAMES[node.module]:
                    raise _Unsure
                _word(alias.name)
                if alias.asname:
                    _word(alias.asname)
                binds_score += (alias.asname or alias.name) == "score"
        elif isinstance(node, ast.MatchClass):
            raise _Unsure  # a class pattern reads attributes named by strings, or by __match_args__
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            _word(node.name)
            binds_score += node.name == "score"
        elif isinstance(node, ast.arg):
            _word(node.arg)
            binds_score += node.arg == "score"
        elif isinstance(node, ast.keyword) and node.arg is not None:
            _word(node.arg)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for name in node.names:
                _word(name)
            binds_score += "score" in node.names
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name is not None:
            _word(node.name)
            binds_score += node.name == "score"
        elif isinstance(node, ast.MatchMapping) and node.rest is not None:
            _word(node.rest)
            binds_score += node.rest == "score"
    # A module is named only to call what it offers: ``re.search``, never ``re.functools``, never
    # the module itself passed on (``m = re``), where no rule here would follow it.
    used_well = {id(name) for name, attribute in module_uses
                 if name.id in modules and attribute in MODULE_NAMES[modules[name.id]]}
    if any(name.id in modules and id(name) not in used_well for name in name_nodes):
        raise _Unsure
    return names, binds_score


def _word(word: str) -> None:
    if word in FRAME_ACCESS or word.startswith("__"):  # dunders, and names a class body mangles
        raise _Unsure
