"""The async twin of ``scorer_groups.evaluations``: every call awaited, the same rules.

    run = await (await client.evaluations.run(dataset_id=..., subject=..., scorer_group_id=...)
                 ).execute(my_agent)
    result = await run.finalize()
    result.gate(fail_under=7)

A sync agent runs in a worker thread, so it never blocks the caller's event loop.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scorer_groups._calls import Call, _model, _paged
from scorer_groups._transport import AsyncTransport as Transport
from scorer_groups.evaluations import Evaluation, _error, _id, _Progress, _upload
from scorer_groups.runs import Dataset, DatasetItem, EvaluationRun


class AsyncDatasets:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def create(self, name: str, rows: Sequence[Mapping[str, Any]] | None = None, *,
                     path: str | Path | None = None, format: str | None = None, description: str | None = None,
                     id: str | None = None) -> Dataset:
        body: dict[str, Any] = {"name": name, **_upload(rows, path, format)}
        body.update({k: v for k, v in (("description", description), ("id", id)) if v is not None})
        return await self._t.run(Call("POST", "/v1/datasets", _model(Dataset), json=body))

    async def add_version(self, id: str, rows: Sequence[Mapping[str, Any]] | None = None, *,
                          path: str | Path | None = None, format: str | None = None) -> Dataset:
        return await self._t.run(Call("POST", f"/v1/datasets/{_id(id)}/versions", _model(Dataset),
                                      json=_upload(rows, path, format)))

    async def get(self, id: str) -> Dataset:
        return await self._t.run(Call("GET", f"/v1/datasets/{_id(id)}", _model(Dataset)))

    async def list(self) -> builtins.list[Dataset]:
        return await self._t.run(_paged("/v1/datasets", Dataset))

    async def rows(self, id: str, version: int | None = None) -> tuple[int, builtins.list[DatasetItem]]:
        params = {} if version is None else {"version": version}
        response = await self._t.send(Call("GET", f"/v1/datasets/{_id(id)}/rows", _model(dict), params=params))
        body = response.json()
        return body["version"], [DatasetItem.model_validate(item) for item in body["items"]]


class AsyncPendingRun:
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

    async def execute(self, agent: Callable[[Any], Any], *, concurrency: int = 8, retries: int = 2,
                      progress: bool | None = None) -> AsyncPendingRun:
        _, items = await AsyncDatasets(self._t).rows(self.run.dataset_id, self.run.dataset_version)
        bar = _Progress(len(items), sys.stderr.isatty() if progress is None else progress)
        slots = asyncio.Semaphore(max(1, concurrency))
        is_async = inspect.iscoroutinefunction(agent)

        async def one(index: int, item: DatasetItem) -> None:
            async with slots:
                for attempt in range(retries + 1):
                    try:
                        output = await agent(item.input) if is_async else await asyncio.to_thread(agent, item.input)
                        self._outputs[index] = {"row": index, "output": output}
                        break
                    except Exception as exc:
                        if attempt == retries:
                            self._outputs[index] = {"row": index, "error": _error(exc)}
            bar.step()

        await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
        return self

    async def finalize(self) -> Evaluation:
        outputs = [self._outputs.get(i, {"row": i, "error": "not executed"}) for i in range(self.run.row_count)]
        run = await self._t.run(Call("POST", f"/v1/evaluations/{_id(self.run.id)}/finalize",
                                     _model(EvaluationRun), json={"outputs": outputs}))
        return Evaluation(run)


class AsyncEvaluations:
    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def run(self, dataset_id: str, subject: Mapping[str, Any], scorer_group_id: str | None = None,
                  scorer_id: str | None = None, additional_scorer_ids: Sequence[str] | None = None,
                  dataset_version: int | None = None) -> AsyncPendingRun:
        body: dict[str, Any] = {"datasetId": dataset_id, "subject": dict(subject)}
        additional = None if additional_scorer_ids is None else list(additional_scorer_ids)
        for key, value in (("scorerGroupId", scorer_group_id), ("scorerId", scorer_id),
                           ("additionalScorerIds", additional), ("datasetVersion", dataset_version)):
            if value is not None:
                body[key] = value
        run = await self._t.run(Call("POST", "/v1/evaluations", _model(EvaluationRun), json=body))
        return AsyncPendingRun(self._t, run)

    async def get(self, id: str) -> Evaluation:
        return Evaluation(await self._t.run(Call("GET", f"/v1/evaluations/{_id(id)}", _model(EvaluationRun))))

    async def list(self) -> builtins.list[EvaluationRun]:
        return await self._t.run(_paged("/v1/evaluations", EvaluationRun))
