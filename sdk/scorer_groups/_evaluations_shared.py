"""What ``evaluations_async.py`` and the ``evaluations.py`` generated from it share, written by
hand: the parts that do no I/O (a finalized ``Evaluation``, a dataset upload's body, the progress
bar), and the one part that cannot be generated - calling the user's agent on a run's rows, which
the async client does on the caller's event loop and the sync client in threads of its own."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from scorer_groups._progress import Line, bar
from scorer_groups.gates import Allowance
from scorer_groups.runs import AgentAnswer, DatasetItem, EvaluationRun

# row index -> {"row": i, "output": ..., "spans": [...]} or {"row": i, "error": ...}
RowAnswers = dict[int, dict[str, Any]]


def _answered(index: int, answer: Any) -> dict[str, Any]:
    """A row's output as finalize sends it: an ``AgentAnswer`` brings its spans along."""
    if isinstance(answer, AgentAnswer):
        return {"row": index, "output": answer.output, **({"spans": answer.spans} if answer.spans else {})}
    return {"row": index, "output": answer}


def _upload(rows: Sequence[Mapping[str, Any]] | None, path: str | Path | None,
            fmt: str | None) -> dict[str, str]:
    """Rows given in Python become JSONL; a file is sent as it is (CSV by its .csv name)."""
    if (rows is None) == (path is None):
        raise ValueError("give rows or path (a JSONL or CSV file), one of them")
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        return {"format": fmt or ("csv" if str(path).lower().endswith(".csv") else "jsonl"), "content": text}
    assert rows is not None
    lines = (json.dumps(dict(r), separators=(",", ":"), ensure_ascii=False) + "\n" for r in rows)
    return {"format": "jsonl", "content": "".join(lines)}


class Evaluation:
    """A finalized run: the server's ``EvaluationRun`` (``rating``, ``rows``, ``breakdown``,
    ``warnings``...) plus ``gate``."""

    def __init__(self, run: EvaluationRun) -> None:
        self.run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)

    @property
    def judge_scorer_results(self) -> list[list[dict[str, Any]]]:
        """Per row, the judge members' labelled verdicts."""
        return [r.get("judgeScorerResults", []) for r in self.run.rows]

    @property
    def scorer_rows(self) -> list[list[dict[str, Any]]]:
        """Per row, the deterministic members' results."""
        return [r.get("scorerRows", []) for r in self.run.rows]

    def gate(self, fail_under: float, scorer: str | None = None, allow_unscored: Allowance = 0) -> float:
        """The run's rating (or the named judge member's average) if it is at least ``fail_under``
        and every row has it (or at most ``allow_unscored`` rows, a count or a fraction, lack it);
        else raises GateFailed, whose ``shortfall`` says by how much."""
        return self.run.columns().gate(fail_under, scorer, allow_unscored)


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


class _Progress:
    """A bar on a terminal; nothing elsewhere (``_progress``, the bar a backfill draws too)."""

    def __init__(self, total: int, shown: bool) -> None:
        self._total, self._done = total, 0
        self._line = Line(shown and total > 0)
        self._lock = threading.Lock()

    def step(self) -> None:
        with self._lock:
            self._done += 1
            self._line.draw(f"{bar(self._done / self._total)} {self._done}/{self._total} rows",
                            last=self._done == self._total)


# --- Calling the agent: the async client's way, then the sync client's --------------------------
# Both try a row up to ``retries`` more times while the agent raises, then record it as failed,
# and run at most ``concurrency`` rows at once.


async def call_agent_async(agent: Callable[[Any], Any], items: Sequence[DatasetItem], *, concurrency: int,
                           retries: int, bar: _Progress) -> RowAnswers:
    """On the running event loop: an async agent is awaited; a sync one runs in threads of the
    run's own (``concurrency`` of them, not the loop's shared default executor) so that it never
    blocks the loop."""
    is_async = inspect.iscoroutinefunction(agent)
    threads = None if is_async else ThreadPoolExecutor(max_workers=max(1, concurrency))
    slots = asyncio.Semaphore(max(1, concurrency))
    outputs: RowAnswers = {}

    async def call(value: Any) -> Any:
        if threads is None:
            return await agent(value)
        # As asyncio.to_thread does: the caller's context variables go along to the thread.
        run_in_context = contextvars.copy_context().run
        return await asyncio.get_running_loop().run_in_executor(threads, run_in_context, agent, value)

    async def one(index: int, item: DatasetItem) -> None:
        async with slots:
            for attempt in range(retries + 1):
                try:
                    outputs[index] = _answered(index, await call(item.input))
                    break
                except Exception as exc:
                    if attempt == retries:
                        outputs[index] = {"row": index, "error": _error(exc)}
        bar.step()

    try:
        await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    finally:
        if threads is not None:
            threads.shutdown(wait=False)
    return outputs


def call_agent(agent: Callable[[Any], Any], items: Sequence[DatasetItem], *, concurrency: int, retries: int,
               bar: _Progress) -> RowAnswers:
    """Without an event loop of the caller's: a sync agent runs in ``concurrency`` threads; an
    async one on an event loop of its own - in a thread of its own when the caller is already
    inside a running loop (a notebook, an async test), where ``asyncio.run`` is refused."""
    if inspect.iscoroutinefunction(agent):
        work = call_agent_async(agent, items, concurrency=concurrency, retries=retries, bar=bar)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(work)
        with ThreadPoolExecutor(max_workers=1) as runner:
            return runner.submit(asyncio.run, work).result()
    outputs: RowAnswers = {}

    def one(index: int, item: DatasetItem) -> None:
        for attempt in range(retries + 1):
            try:
                outputs[index] = _answered(index, agent(item.input))
                break
            except Exception as exc:
                if attempt == retries:
                    outputs[index] = {"row": index, "error": _error(exc)}
        bar.step()

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as threads:
        list(threads.map(one, range(len(items)), items))
    return outputs
