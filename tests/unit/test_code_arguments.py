"""A code scorer is sent only the arguments its code names (scoring/members/code_arguments.py):
the spans, most of a payload, cross the pipe only for a scorer that reads them. Whenever the code
could reach an argument without naming it - a frame, a namespace, an attribute by computed name,
another ``score`` than the one read - all five are sent, as before."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from scoring.catalog import CatalogSnapshot
from scoring.members.code_arguments import ALL_ARGUMENTS, arguments_read
from scoring.members.sandbox import SandboxPool
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
    # A name shadowed elsewhere is still counted: sending an argument unread costs only bytes.
    ("    return 1.0\ndef other(spans):\n    return spans\n", {"spans"}),
])
def test_the_arguments_a_scorer_names_are_the_ones_it_reads(body: str, read: set[str]) -> None:
    assert arguments_read(HEAD + body) == read


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
    "x = 1\n" * 3000 + HEAD + "    return len(output) / 10\n",
    # What does not parse: the sandbox reports it, with every argument sent as before.
    HEAD + "    return (\n",
    "x = " + "(" * 300 + "1" + ")" * 300 + "\n" + HEAD + "    return 1.0\n",
])
def test_code_that_could_read_an_argument_without_naming_it_is_sent_all_five(code: str) -> None:
    assert arguments_read(code) == ALL_ARGUMENTS


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
