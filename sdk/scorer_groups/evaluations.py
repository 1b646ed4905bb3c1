"""Dataset runs from the SDK, as the spec shows them:

    run = client.evaluations.run(dataset_id=dataset.id, subject={"kind": "custom_agent",
                                 "displayName": "my-agent"}, scorer_group_id=group.id
                                 ).execute(my_agent).finalize()
    run.gate(fail_under=7)                    # the group score; raises GateFailed with the shortfall
    run.gate(fail_under=8, scorer="Safety")   # a judge member's own average, by its label

``execute`` calls the agent (a function of the row's input, sync or async) on every row, at most
``concurrency`` at once, retrying a row whose call raises up to ``retries`` more times; a row
that still fails is sent as failed and counts as a row without a score (the gate fails closed
on it unless ``allow_unscored`` lets it pass). ``finalize`` uploads the outputs; the server
grades them (judges through its own endpoint) and answers the run with every row's result.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import json
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

from scorer_groups._calls import Call, _model, _paged
from scorer_groups._transport import Transport
from scorer_groups.gates import Allowance, GateFailed, NotAJudgeMember
from scorer_groups.runs import Dataset, DatasetItem, EvaluationRun

__all__ = ["Datasets", "Evaluation", "Evaluations", "GateFailed", "NotAJudgeMember", "PendingRun"]


def _id(value: str) -> str:
    return quote(str(value), safe="")


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


class Datasets:
    """``client.datasets``: a project's datasets, one version per upload."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(self, name: str, rows: Sequence[Mapping[str, Any]] | None = None, *, path: str | Path | None = None,
               format: str | None = None, description: str | None = None, id: str | None = None) -> Dataset:
        body: dict[str, Any] = {"name": name, **_upload(rows, path, format)}
        body.update({k: v for k, v in (("description", description), ("id", id)) if v is not None})
        return self._t.run(Call("POST", "/v1/datasets", _model(Dataset), json=body))

    def add_version(self, id: str, rows: Sequence[Mapping[str, Any]] | None = None, *,
                    path: str | Path | None = None, format: str | None = None) -> Dataset:
        return self._t.run(Call("POST", f"/v1/datasets/{_id(id)}/versions", _model(Dataset),
                                json=_upload(rows, path, format)))

    def get(self, id: str) -> Dataset:
        return self._t.run(Call("GET", f"/v1/datasets/{_id(id)}", _model(Dataset)))

    def list(self) -> builtins.list[Dataset]:
        return self._t.run(_paged("/v1/datasets", Dataset))

    def rows(self, id: str, version: int | None = None) -> tuple[int, builtins.list[DatasetItem]]:
        params = {} if version is None else {"version": version}
        body = self._t.send(Call("GET", f"/v1/datasets/{_id(id)}/rows", _model(dict), params=params)).json()
        return body["version"], [DatasetItem.model_validate(item) for item in body["items"]]


class Evaluation:
    """A finalized run: the server's ``EvaluationRun`` (``rating``, ``rows``, ``breakdown``,
    ``warnings``...) plus ``gate``."""

    def __init__(self, run: EvaluationRun) -> None:
        self.run = run

    def __getattr__(self, name: str) -> Any:
        return getattr(self.run, name)

    @property
    def judge_scorer_results(self) -> builtins.list[builtins.list[dict[str, Any]]]:
        """Per row, the judge members' labelled verdicts."""
        return [r.get("judgeScorerResults", []) for r in self.run.rows]

    @property
    def scorer_rows(self) -> builtins.list[builtins.list[dict[str, Any]]]:
        """Per row, the deterministic members' results."""
        return [r.get("scorerRows", []) for r in self.run.rows]

    def gate(self, fail_under: float, scorer: str | None = None, allow_unscored: Allowance = 0) -> float:
        """The run's rating (or the named judge member's average) if it is at least ``fail_under``
        and every row has it (or at most ``allow_unscored`` rows, a count or a fraction, lack it);
        else raises GateFailed, whose ``shortfall`` says by how much."""
        return self.run.columns().gate(fail_under, scorer, allow_unscored)


class PendingRun:
    """A created run: ``execute`` the agent on its rows, then ``finalize``."""

    def __init__(self, transport: Transport, run: EvaluationRun) -> None:
        self._t = transport
        self.run = run
        self.warnings = run.warnings
        self._outputs: dict[int, dict[str, Any]] = {}
        for warning in run.warnings:
            print(f"warning: {warning}", file=sys.stderr)

    @property
    def id(self) -> str:
        return self.run.id

    def execute(self, agent: Callable[[Any], Any], *, concurrency: int = 8, retries: int = 2,
                progress: bool | None = None) -> PendingRun:
        """Call ``agent(row_input)`` on every row of the dataset version the run records."""
        _, items = Datasets(self._t).rows(self.run.dataset_id, self.run.dataset_version)
        bar = _Progress(len(items), sys.stderr.isatty() if progress is None else progress)
        if inspect.iscoroutinefunction(agent):
            work = self._execute_async(agent, items, concurrency, retries, bar)
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                asyncio.run(work)
            else:  # called from inside an event loop (a notebook, an async test): its own thread
                with ThreadPoolExecutor(max_workers=1) as runner:
                    runner.submit(asyncio.run, work).result()
        else:
            with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
                list(pool.map(lambda pair: self._answer(pair[0], lambda: agent(pair[1].input), retries, bar),
                              enumerate(items)))
        return self

    async def _execute_async(self, agent: Callable[[Any], Any], items: builtins.list[DatasetItem],
                             concurrency: int, retries: int, bar: _Progress) -> None:
        slots = asyncio.Semaphore(max(1, concurrency))

        async def one(index: int, item: DatasetItem) -> None:
            async with slots:
                for attempt in range(retries + 1):
                    try:
                        self._outputs[index] = {"row": index, "output": await agent(item.input)}
                        break
                    except Exception as exc:
                        if attempt == retries:
                            self._outputs[index] = {"row": index, "error": _error(exc)}
            bar.step()

        await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))

    def _answer(self, index: int, call: Callable[[], Any], retries: int, bar: _Progress) -> None:
        for attempt in range(retries + 1):
            try:
                self._outputs[index] = {"row": index, "output": call()}
                break
            except Exception as exc:
                if attempt == retries:
                    self._outputs[index] = {"row": index, "error": _error(exc)}
        bar.step()

    def finalize(self) -> Evaluation:
        """Upload the outputs; the server grades them and answers the completed run."""
        outputs = [self._outputs.get(i, {"row": i, "error": "not executed"}) for i in range(self.run.row_count)]
        run = self._t.run(Call("POST", f"/v1/evaluations/{_id(self.run.id)}/finalize", _model(EvaluationRun),
                               json={"outputs": outputs}))
        return Evaluation(run)


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


class _Progress:
    """A bar on a terminal; nothing elsewhere."""

    def __init__(self, total: int, shown: bool) -> None:
        self._total, self._shown, self._done = total, shown and total > 0, 0
        self._lock = threading.Lock()

    def step(self) -> None:
        with self._lock:
            self._done += 1
            if self._shown:
                filled = int(30 * self._done / self._total)
                sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self._done}/{self._total} rows")
                if self._done == self._total:
                    sys.stderr.write("\n")
                sys.stderr.flush()


class Evaluations:
    """``client.evaluations``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def run(self, dataset_id: str, subject: Mapping[str, Any], scorer_group_id: str | None = None,
            scorer_id: str | None = None, additional_scorer_ids: Sequence[str] | None = None,
            dataset_version: int | None = None) -> PendingRun:
        """A run of the dataset's latest version (or ``dataset_version``). The group wins when
        both ``scorer_group_id`` and ``scorer_id`` are given, and nulls ``additional_scorer_ids``
        (the run's ``warnings`` say so, and are printed)."""
        body: dict[str, Any] = {"datasetId": dataset_id, "subject": dict(subject)}
        additional = None if additional_scorer_ids is None else list(additional_scorer_ids)
        for key, value in (("scorerGroupId", scorer_group_id), ("scorerId", scorer_id),
                           ("additionalScorerIds", additional), ("datasetVersion", dataset_version)):
            if value is not None:
                body[key] = value
        run = self._t.run(Call("POST", "/v1/evaluations", _model(EvaluationRun), json=body))
        return PendingRun(self._t, run)

    def get(self, id: str) -> Evaluation:
        return Evaluation(self._t.run(Call("GET", f"/v1/evaluations/{_id(id)}", _model(EvaluationRun))))

    def list(self) -> builtins.list[EvaluationRun]:
        return self._t.run(_paged("/v1/evaluations", EvaluationRun))
