"""Which of ``score(input, output, expected, spans, metadata)``'s arguments a code scorer reads.

A code scorer's arguments cross a pipe as JSON on every call, and a trace's spans are most of
them (span documents built, encoded, sent and decoded were ~12% of a deterministic
trace's CPU, for scorers that mostly read ``output``). An argument the code never names is not
sent: the sandbox passes None in its place. What a tenant gains by fooling this is nothing - an
argument of its own subject, unsent - but a scorer that reads one must get it, so the reading is
conservative: unless every rule holds, all five are sent, as before.

1. the source is at most ``MAX_READ_CHARS`` long (it is read on the event loop, once per version
   and worker) and parses (else the sandbox reports the error);
2. ``score`` is bound once, by a plain top-level ``def`` with five named positional parameters
   (no ``*args``/``**kwargs``, no decorator, no other binding anywhere): the function read is the
   function called;
3. nothing in it can reach a value by a name that is not written as a variable. Code does that
   through frames and namespaces (``locals()``, a traceback's frame), through attribute access by
   a name computed at run time (``getattr``, a format string's fields, a class pattern of
   ``match``, ``type()`` with a computed dunder), through text made code (``eval``, pickle,
   annotations) and through modules that hand out other modules (``re.functools``) - so: imports
   only of ``PLAIN_MODULES`` and of their public functions and classes, a module named only as
   ``module.function``; no ``match`` class pattern; ``.format`` only on a string literal; no private
   or dunder name or attribute; no word of ``FRAME_ACCESS``, in the code or in its strings and bytes
   (normalised as Python normalises identifiers);
4. a parameter is read when a variable of its name appears anywhere (a nested function, a lambda,
   an f-string), shadowed or not: over-counting only sends an argument unread.

The contract users read (docs/concepts.md): a scorer gets the arguments its code names; code
that reaches them another way gets all five when these rules recognise it, and None for the ones
it does not name when they do not - never anything but its own subject's arguments.
tests/unit/test_code_arguments.py holds the attacks two reviews found.
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
