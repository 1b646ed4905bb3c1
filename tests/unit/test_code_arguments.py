"""A code scorer is sent only the arguments its code names (scoring/members/code_arguments.py):
the spans, most of a payload, cross the pipe only for a scorer that reads them. Whenever the code
could reach an argument without naming it - a frame, a namespace, an attribute by computed name,
another ``score`` than the one read - all five are sent, as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from adapters.members.sandbox import SandboxPool
from scoring.catalog import CatalogSnapshot
from scoring.members.code_arguments import ALL_ARGUMENTS, arguments_read
from scoring.models import CustomEvaluator
from scoring.panel import Panel
from scoring.subjects import Subject, Trace, trace_subject
from tests.support.panel_catalog import catalog, group

HEAD = "def score(input, output, expected, spans, metadata):\n"


@pytest.mark.parametrize(("body", "read"), [
    ("    return min(1.0, len(output) / 600)\n", {"output"}),
    ("    return float(bool(input) and bool(metadata))\n", {"input", "metadata"}),
    ("    return 1.0\n", set()),
    # Read anywhere counts: a closure, a lambda, an f-string, a comprehension, a default.
    ("    f = lambda: len(spans)\n    return f() / 10\n", {"spans"}),
    ("    def inner():\n        return expected\n    return float(inner() is None)\n", {"expected"}),
    ("    return float(len(f'{input}') > 3)\n", {"input"}),
    ("    return float(any(s['name'] for s in spans))\n", {"spans"}),
    ("    g = lambda x=metadata: x\n    return 1.0\n", {"metadata"}),
    # Plain modules and literal format strings keep a scorer read precisely.
    ("    return float(bool(re.search('refund', output)))\n", {"output"}),
    ("    return float(len(collections.Counter(input)) > 3)\n", {"input"}),
    ("    return float(len('{} {}'.format(output, metadata)) > 3)\n", {"output", "metadata"}),
    # A name shadowed elsewhere is still counted: sending an argument unread costs only bytes.
    ("    return 1.0\ndef other(spans):\n    return spans\n", {"spans"}),
])
def test_the_arguments_a_scorer_names_are_the_ones_it_reads(body: str, read: set[str]) -> None:
    assert arguments_read("import re\nfrom collections import Counter\nimport collections\n" + HEAD + body) == read


def test_the_parameters_are_matched_by_position_whatever_their_names() -> None:
    assert arguments_read("def score(a, b, c, d, e):\n    return len(d) / 10\n") == {"spans"}
    assert arguments_read("def score(a, b, c, d, e, /):\n    return len(a) / 10\n") == {"input"}


@pytest.mark.parametrize("code", [
    # Frames and namespaces: how code reads a variable it does not name.
    HEAD + "    return float(len(locals()['spans']) > 0)\n",
    HEAD + "    return float(len(vars()) > 0)\n",
    "import sys\n" + HEAD + "    return float(len(sys._getframe().f_locals) > 0)\n",
    "from sys import _getframe as g\n" + HEAD + "    return 1.0\n",
    "import inspect\n" + HEAD + "    return 1.0\n",
    HEAD + "    try:\n        1 / 0\n    except Exception as error:\n"
           "        return float(len(error.__traceback__.tb_frame.f_locals) > 0)\n",
    HEAD + "    try:\n        1 / 0\n    except Exception as error:\n"
           "        return float(len('{0.__traceback__.tb_frame.f_locals}'.format(error)) > 0)\n",
    HEAD + "    gen = (x for x in [1])\n    return float(gen.gi_frame is not None)\n",
    HEAD + "    return float(getattr(score, 'x', 1.0))\n",
    HEAD + "    return eval('len(output)') / 10\n",
    "import operator\n" + HEAD + "    return float(operator.attrgetter('x')(1) or 1)\n",
    HEAD + "    return float(score.__defaults__ is None)\n",
    # A module is named only to call what it offers.
    "import re\n" + HEAD + "    m = re\n    return 1.0\n",
    "import re\n" + HEAD + "    return float(re.functools is None)\n",
    "from re import functools\n" + HEAD + "    return 1.0\n",
    "import collections.abc\n" + HEAD + "    return 1.0\n",
    "import re\n" + HEAD + "    return float(len(output) > 0)\nre = None\n",
    # Another score() than the one read here may be the one called.
    HEAD + "    return 1.0\nscore = lambda *args: len(args[3])\n",
    HEAD + "    return 1.0\n" + HEAD + "    return len(spans)\n",
    HEAD + "    return 1.0\nif True:\n" + HEAD.replace("def", "    def") + "        return len(spans)\n",
    "from json import *\n" + HEAD + "    return 1.0\n",
    "import json as score\n" + HEAD + "    return 1.0\n",
    HEAD + "    return 1.0\nfor score in [print]:\n    pass\n",
    HEAD + "    global score\n    return 1.0\n",
    "def wrap(f):\n    return f\n@wrap\n" + HEAD + "    return 1.0\n",
    "def score(*args):\n    return len(args[3])\n",
    "def score(input, output, expected, spans, metadata, **more):\n    return 1.0\n",
    "def score(input, output, expected, spans):\n    return 1.0\n",
    "async def score(input, output, expected, spans, metadata):\n    return 1.0\n",
    "score = print\n",
    # Too long to read on the event loop (a hostile tenant's thousands of statements).
    "x = 1\n" * 520 + HEAD + "    return len(output) / 10\n",
    # What does not parse: the sandbox reports it, with every argument sent as before.
    HEAD + "    return (\n",
    "x = " + "(" * 300 + "1" + ")" * 300 + "\n" + HEAD + "    return 1.0\n",
])
def test_code_that_could_read_an_argument_without_naming_it_is_sent_all_five(code: str) -> None:
    assert arguments_read(code) == ALL_ARGUMENTS


# Two reviews' attacks (each, with the rules of step 3 missing, read an argument it was not sent:
# verified by running it with and without the argument): a word list alone, then modules that
# hand out other modules, type reached through mro, annotations evaluated, the process's memory.
REVIEWED_ATTACKS = {
    'match_class_kwd': 'def score(input, output, expected, spans, metadata):\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        match e:\n            case BaseException(__traceback__=object(tb_frame=object(f_locals={"input": v}))):\n                return len(str(v))\n    return 0\n',
    'importfrom_module': 'from inspect import stack, getargvalues\n\ndef score(input, output, expected, spans, metadata):\n    loc = getargvalues(stack()[0][0])[3]\n    return len(str(loc["input"]))\n',
    'name_mangling': 'def score(_C__x, output, expected, spans, metadata):\n    class C:\n        def m(self):\n            return __x\n    return len(str(C().m()))\n',
    'format_concat': 'import string\n\ndef score(input, output, expected, spans, metadata):\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        field = "0._" + "_trace" + "back_" + "_.tb_fr" + "ame.f_lo" + "cals"\n        loc, _ = string.Formatter().get_field(field, (e,), {})\n        return len(str(loc["input"]))\n',
    'pkgutil_resolve': 'import pkgutil\n\ndef score(input, output, expected, spans, metadata):\n    ev = pkgutil.resolve_name("built" + "ins:ev" + "al")\n    return len(str(ev("inp" + "ut")))\n',
    'bytes_literal_format': 'def score(input, output, expected, spans, metadata):\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        return len(b"{0.__traceback__.tb_frame.f_locals}".decode().format(e))\n',
    'pickle_bytes': 'import pickle\n\ndef score(input, output, expected, spans, metadata):\n    loc = pickle.loads(b"cbuiltins\\ngetattr\\n(csys\\n_getframe\\n(tRVf_locals\\ntR.")\n    return len(str(loc["input"]))\n',
    'nfkc_annotation': 'import typing\n\ndef score(input, output, expected, spans, metadata):\n    def h(x: "[_＿ｉｍｐｏｒｔ＿＿(\'sy\'+\'s\')._ｇｅｔｆｒａｍｅ(4).ｆ_ｌｏｃａｌｓ.get(\'inp\'+\'ut\')]"): pass\n    return len(str(typing.get_type_hints(h)["x"][0]))\n',
    'builtins_only_format': 'def score(input, output, expected, spans, metadata):\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        text = ("{0._" + "_traceback_" + "_.tb_fr" + "ame.f_lo" + "cals[inp" + "ut]}").format(e)\n        return len(text)\n',
    'rebind_score': 'from inspect import stack, getargvalues\n\ndef score(input, output, expected, spans, metadata):\n    return 0\n\ndef other(a, b, c, d, e):\n    return len(str(a))\n\ngetargvalues(stack()[0][0])[3]["score"] = other\n',
    'exitstack_tb_match': 'import contextlib\n\ndef score(input, output, expected, spans, metadata):\n    seen = []\n    with contextlib.ExitStack() as stack:\n        stack.push(lambda kind, exc, tb: seen.append(tb) or True)\n        1 / 0\n    match seen[0]:\n        case object(tb_frame=object(f_locals={"input": v})):\n            return len(str(v))\n',
    'walrus_format_map': 'class Keys(dict):\n    pass\n\ndef score(input, output, expected, spans, metadata):\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        f = "{e._" + "_traceback_" + "_.tb_fr" + "ame.f_lo" + "cals[inp" + "ut]}"\n        return len(f.format_map({"e": e}))\n',
    'type_instancecheck_match': 'def score(input, output, expected, spans, metadata):\n    d = "_" + "_"\n    def picker(name):\n        meta = type("M", (type,), {d + "instancecheck" + d: lambda cls, obj: True})\n        return meta("P", (), {d + "match_args" + d: (name,)})\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        T, F, L = picker(d + "trace" + "back" + d), picker("tb_fr" + "ame"), picker("f_loc" + "als")\n        match e:\n            case T(F(L(loc))):\n                return len(str(loc["input"]))\n',
    'functools_update_wrapper': 'import functools\n\ndef score(input, output, expected, spans, metadata):\n    d = "_" + "_"\n    box = []\n    Sink = type("Sink", (), {d + "set" + "attr" + d: lambda self, k, v: box.append(v)})\n    def fetch(obj, name):\n        functools.update_wrapper(Sink(), obj, assigned=(name,), updated=())\n        value = box[0]; box.clear(); return value\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        loc = fetch(fetch(fetch(e, d + "trace" + "back" + d), "tb_fr" + "ame"), "f_loc" + "als")\n        return len(str(loc["input"]))\n',
    'abcmeta_crcode': 'import fractions\n\nasync def tmpl(m, n):\n    return aaaa(m).bbbb(n).cccc\n\ndef score(input, output, expected, spans, metadata):\n    d = "_" + "_"\n    meta = fractions.numbers.ABCMeta\n    make = meta.mro(meta)[1](tmpl)\n    c = tmpl(0, 0)\n    code = c.cr_code.replace(co_names=(d + "import" + d, "_get" + "fr" + "ame", "f_lo" + "cals"))\n    c.close()\n    try:\n        make(code, {})("s" + "ys", 1).send(None)\n    except StopIteration as stop:\n        return len(str(stop.value["inp" + "ut"]))\n',
    'functiontype_gicode': 'import re\n\ndef tmpl(m, n):\n    yield aaaa(m).bbbb(n).cccc\n\ndef score(input, output, expected, spans, metadata):\n    d = "_" + "_"\n    names = (d + "import" + d, "_get" + "fr" + "ame", "f_lo" + "cals")\n    code = tmpl(0, 0).gi_code.replace(co_names=names)\n    make = re.enum.EnumType.mro(re.enum.EnumType)[1](tmpl)\n    loc = next(make(code, {})("s" + "ys", 1))\n    return len(str(loc["inp" + "ut"]))\n',
    'singledispatch_annotation': 'import re\n\nB = []\n\ndef score(input, output, expected, spans, metadata):\n    def h(x: bytes([66, 46, 97, 112, 112, 101, 110, 100, 40, 91, 120, 46, 102, 95, 108, 111, 99, 97, 108, 115, 32, 102, 111, 114, 32, 120, 32, 105, 110, 32, 109, 97, 112, 40, 95, 95, 105, 109, 112, 111, 114, 116, 95, 95, 40, 39, 115, 121, 115, 39, 41, 46, 95, 103, 101, 116, 102, 114, 97, 109, 101, 44, 32, 114, 97, 110, 103, 101, 40, 49, 44, 32, 55, 41, 41, 93, 41, 32, 111, 114, 32, 105, 110, 116]).decode()):\n        pass\n    re.functools.singledispatch(h).register(h)\n    for loc in B[0]:\n        for k, v in loc.items():\n            if k == "inp" + "ut":\n                return len(str(v))\n    return -1\n',
    'singledispatch_return_annotation_textwrap': 'import textwrap\n\nB = []\n\ndef score(input, output, expected, spans, metadata):\n    d = "_" + "_"\n    text = ("B.append([x.f_lo" + "cals for x in map(" + d + "import" + d + "(\'s" + "ys\')._get"\n            + "fr" + "ame, range(1, 7))]) or int")\n    def h(x) -> text:\n        pass\n    try:\n        textwrap.re.functools.singledispatch(h).register(h)\n    except Exception:\n        pass\n    for loc in B[0]:\n        if "inp" + "ut" in loc:\n            return len(str(loc["inp" + "ut"]))\n    return -1\n',
    'proc_self_mem': 'def score(input, output, expected, spans, metadata):\n    pattern = id(output).to_bytes(8, "little") + id(expected).to_bytes(8, "little")\n    mem = open("/proc/self/mem", "rb", buffering=0)\n    for line in open("/proc/self/maps"):\n        parts = line.split()\n        if not parts[1].startswith("rw") or len(parts) > 5:\n            continue\n        lo, hi = (int(x, 16) for x in parts[0].split("-"))\n        if hi - lo > 64 << 20:\n            continue\n        try:\n            mem.seek(lo)\n            chunk = mem.read(hi - lo)\n        except OSError:\n            continue\n        at = chunk.find(pattern)\n        while at >= 8:\n            first = int.from_bytes(chunk[at - 8:at], "little")\n            if first == id(None):\n                return 0.0\n            at = chunk.find(pattern, at + 1)\n    return 1.0\n',
}


@pytest.mark.parametrize("name", sorted(REVIEWED_ATTACKS))
def test_code_that_reaches_an_argument_by_a_name_built_at_run_time_is_sent_all_five(name: str) -> None:
    assert arguments_read(REVIEWED_ATTACKS[name]) == ALL_ARGUMENTS


def test_a_payload_carries_only_the_arguments_read_and_builds_no_spans_otherwise() -> None:
    s = traced("p", 1)
    assert s.member_payload(frozenset({"output"})) == {"output": s.output}
    assert list(s.member_payload()) == ["input", "output", "expected", "spans", "metadata"]
    assert s.member_payload(frozenset({"spans"}))["spans"] == s.member_payload()["spans"]


# --- in the sandbox ---------------------------------------------------------------------------------

class RecordingSandbox(SandboxPool):
    """The real pool, keeping what each batch sent."""

    def __init__(self) -> None:
        super().__init__(size=1)
        self.sent: list[dict[str, Any]] = []

    async def run_many(self, project: str, key: str, code: str, calls: list[dict[str, Any]],
                       timeout_s: float) -> list[float | bool | Any]:
        self.sent += calls
        return await super().run_many(project, key, code, calls, timeout_s)

    async def run(self, project: str, key: str, code: str, args: dict[str, Any], timeout_s: float) -> Any:
        self.sent.append(args)
        return await super().run(project, key, code, args, timeout_s)


@pytest.fixture
async def sandbox() -> AsyncIterator[RecordingSandbox]:
    pool = RecordingSandbox()
    await pool.start()
    yield pool
    await pool.close()


def traced(project: str, n: int) -> Subject:
    return trace_subject(Trace.model_validate({
        "traceId": f"t{n}", "projectId": project, "agentId": "a", "timestamp": "2026-12-02T13:00:00Z",
        "metadata": {"n": n},
        "spans": [{"spanId": "root", "input": "question", "output": "x" * n},
                  {"spanId": "llm", "parentSpanId": "root", "kind": "llm", "output": "draft"}]}))


def scorers_with(scorer: CustomEvaluator) -> CatalogSnapshot:
    base = catalog("http://127.0.0.1:9")
    return CatalogSnapshot(version=2, judges=base.judges, patterns=base.patterns,
                           customs={**base.customs, scorer.id: scorer})


async def score_both_ways(sandbox: RecordingSandbox, source: str) -> tuple[list[Any], list[Any]]:
    """Each subject's verdict in bulk (one message) and one by one."""
    scorer = CustomEvaluator(id="c", name="C", type="code", code=source)
    g, scorers = group(("custom", "c", 1, False)), scorers_with(scorer)
    panel = Panel(sandbox=sandbox, member_deadline_s=10)
    items = [(g, traced("p", n)) for n in (1, 2, 3)]
    bulk = [r.blend.members[0].outcome for r in await panel.score_many(items, scorers)]
    alone = [(await panel.score(g, s, scorers)).blend.members[0].outcome for _, s in items]
    return [(o.native, o.error) for o in bulk], [(o.native, o.error) for o in alone]


async def test_a_scorer_that_reads_only_the_output_is_sent_only_the_output(sandbox: RecordingSandbox) -> None:
    bulk, alone = await score_both_ways(sandbox, HEAD + "    return len(output) / 10\n")
    assert bulk == alone == [(0.1, None), (0.2, None), (0.3, None)]
    assert sandbox.sent and all(set(args) == {"output"} for args in sandbox.sent)


async def test_a_scorer_that_reads_its_spans_through_a_closure_gets_them(sandbox: RecordingSandbox) -> None:
    source = HEAD + "    count = lambda: len(spans) + len(spans[0]['output'])\n    return count() / 10\n"
    bulk, alone = await score_both_ways(sandbox, source)
    assert bulk == alone == [(0.3, None), (0.4, None), (0.5, None)]
    assert all(set(args) == {"spans"} for args in sandbox.sent)


async def test_a_scorer_that_reads_its_arguments_through_its_frame_sees_all_of_them(
        sandbox: RecordingSandbox) -> None:
    # It names none of them: were they left out on its word, it would read None here.
    source = HEAD.replace("(input, output, expected, spans, metadata)", "(a, b, c, d, e)") + (
        "    got = locals()\n"
        "    return float(got['b'] == 'x' * got['e']['n'] and len(got['d']) == 2 and got['a'] == 'question')\n")
    bulk, alone = await score_both_ways(sandbox, source)
    assert bulk == alone == [(1.0, None)] * 3
    assert all(list(args) == ["input", "output", "expected", "spans", "metadata"] for args in sandbox.sent)
