"""The SDK's sync modules are generated from its async sources (sdk/tools/generate_sync.py): the
committed ones must be exactly what the sources generate now, so that a hand edit of a generated
module, or an async change left ungenerated, fails the suite (the fix: ./dev sdk). The one part
written twice by hand, how each client calls the user's agent on a run's rows, must agree."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import threading
import tokenize
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from scorer_groups._evaluations_shared import RowAnswers, _Progress, call_agent, call_agent_async
from scorer_groups.runs import DatasetItem

TOOL = Path(__file__).resolve().parents[2] / "sdk" / "tools" / "generate_sync.py"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    """The generator, loaded from its file: a development script, not part of any package."""
    spec = importlib.util.spec_from_file_location("generate_sync", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(tool: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return tool.generate(tmp_path_factory.mktemp("sync_modules"))  # type: ignore[no-any-return]


def test_the_committed_sync_modules_are_what_their_async_sources_generate(
        tool: ModuleType, generated: list[Path]) -> None:
    assert sorted(path.name for path in generated) == sorted(tool.MODULES.values())
    for path in generated:
        committed = tool.PACKAGE / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"sdk/scorer_groups/{path.name} is not what its async source generates: edit the source, then ./dev sdk")


def test_each_generated_module_names_its_source_first(tool: ModuleType, generated: list[Path]) -> None:
    sources = {target: source for source, target in tool.MODULES.items()}
    for path in generated:
        first = path.read_text(encoding="utf-8").splitlines()[0]
        assert first.startswith(f"# Generated from {sources[path.name]} ") and "do not edit" in first


def test_no_async_name_is_left_in_the_generated_code(generated: list[Path]) -> None:
    """An Async name that the generator's table lacks would come out as unasync's default SyncX
    (or stay async): each needs a rule of its own."""
    for path in generated:
        with path.open(encoding="utf-8") as code:
            names = {token.string for token in tokenize.generate_tokens(code.readline) if token.type == tokenize.NAME}
        left = {name for name in names if name in {"async", "await", "asyncio"}
                or name.startswith(("Async", "Sync")) or name.endswith("_async")}
        assert not left, f"{path.name}: {sorted(left)}"


def test_the_check_finds_a_hand_edited_module(tool: ModuleType, tmp_path: Path) -> None:
    for target in tool.MODULES.values():
        shutil.copy(tool.PACKAGE / target, tmp_path / target)
    assert tool.stale(tmp_path) == []
    edited = next(iter(tool.MODULES.values()))
    with (tmp_path / edited).open("a", encoding="utf-8") as module:
        module.write("# a hand edit\n")
    assert tool.stale(tmp_path) == [edited]


# --- The hand-written part: calling the agent, the async client's way and the sync client's ----


def call_with(way: str, agent: Callable[[Any], Any], inputs: list[str], concurrency: int, retries: int) -> RowAnswers:
    items = [DatasetItem(input=value) for value in inputs]
    bar = _Progress(len(items), False)
    if way == "async client":
        return asyncio.run(call_agent_async(agent, items, concurrency=concurrency, retries=retries, bar=bar))
    return call_agent(agent, items, concurrency=concurrency, retries=retries, bar=bar)


@pytest.mark.parametrize("kind", ["sync agent", "async agent"])
def test_both_clients_retry_and_record_a_failing_agent_alike(kind: str) -> None:
    inputs = ["a", "b", "never", "c"]
    tries: dict[str, int] = {}
    lock = threading.Lock()

    def answer(value: str) -> str:
        with lock:
            tries[value] = tries.get(value, 0) + 1
            first = tries[value] == 1
        if first or value == "never":  # every row fails once; one row always
            raise ValueError(f"no answer to {value}")
        return value.upper()

    async def answer_async(value: str) -> str:
        return answer(value)

    agent = answer if kind == "sync agent" else answer_async
    results = {}
    for way in ("async client", "sync client"):
        tries.clear()
        results[way] = call_with(way, agent, inputs, concurrency=2, retries=1)
    assert results["async client"] == results["sync client"]
    for index, value in enumerate(inputs):
        if value == "never":
            assert results["sync client"][index] == {"row": index, "error": f"ValueError: no answer to {value}"}
        else:
            assert results["sync client"][index] == {"row": index, "output": value.upper()}


@pytest.mark.parametrize("way", ["async client", "sync client"])
def test_a_sync_agent_runs_concurrency_rows_at_once(way: str) -> None:
    """As many threads as ``concurrency`` asks, even above the event loop's default executor
    (min(32, cores + 4)): every call waits until that many are in at once, else none answers."""
    concurrency = min(32, (os.cpu_count() or 1) + 4) + 2
    together = threading.Barrier(concurrency, timeout=10)

    def agent(value: str) -> str:
        together.wait()
        return value

    inputs = [str(i) for i in range(concurrency)]
    outputs = call_with(way, agent, inputs, concurrency=concurrency, retries=0)
    assert [outputs[i].get("output") for i in range(concurrency)] == inputs
