# Generated from evaluations_async.py by sdk/tools/generate_sync.py - do not edit; run `./dev sdk` to regenerate.
"""Dataset runs from the SDK, as a team writes them:

    run = client.evaluations.run(dataset_id=dataset.id, subject={"kind": "custom_agent",
                                 "displayName": "my-agent"}, scorer_group_id=group.id
                                 ).execute(my_agent).finalize()
    run.gate(fail_under=7)                    # the group score; raises GateFailed with the shortfall
    run.gate(fail_under=8, scorer="Safety")   # a judge member's own average, by its label

and with ``AsyncClient``, every call awaited:

    pending = await client.evaluations.run(dataset_id=..., subject=..., scorer_group_id=...)
    run = await (await pending.execute(my_agent)).finalize()

``execute`` calls the agent (a function of the row's input, sync or async) on every row, at most
``concurrency`` at once, retrying a row whose call raises up to ``retries`` more times; a row
that still fails is sent as failed and counts as a row without a score (the gate fails closed
on it unless ``allow_unscored`` lets it pass). ``finalize`` uploads the outputs; the server
grades them (judges through its own endpoint) and answers the run with every row's result.

Written once, as ``evaluations_async.py``; ``evaluations.py`` is generated from it by
sdk/tools/generate_sync.py. How each calls the agent is ``_evaluations_shared``'s.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scorer_groups._calls import Call, _id, _model, _paged
from scorer_groups._evaluations_shared import Evaluation, _Progress, _upload, call_agent
from scorer_groups._transport import Transport
from scorer_groups.api_models import RowCalls
from scorer_groups.gates import GateFailed, NotAJudgeMember
from scorer_groups.runs import Dataset, DatasetItem, EvaluationRun

__all__ = ["Datasets", "Evaluations", "PendingRun"]
__all__ += ["Evaluation", "GateFailed", "NotAJudgeMember"]  # re-exported: shared by both clients


class Datasets:
    """``client.datasets``: a project's datasets, one version per upload."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def create(
        self, name: str, rows: Sequence[Mapping[str, Any]] | None = None, *, path: str | Path | None = None,
        format: str | None = None, description: str | None = None, id: str | None = None,
    ) -> Dataset:
        body: dict[str, Any] = {"name": name, **_upload(rows, path, format)}
        body.update({k: v for k, v in (("description", description), ("id", id)) if v is not None})
        return self._t.run(Call("POST", "/v1/datasets", _model(Dataset), json=body))

    def add_version(
        self, id: str, rows: Sequence[Mapping[str, Any]] | None = None, *,
        path: str | Path | None = None, format: str | None = None,
    ) -> Dataset:
        call = Call("POST", f"/v1/datasets/{_id(id)}/versions", _model(Dataset), json=_upload(rows, path, format))
        return self._t.run(call)

    def get(self, id: str) -> Dataset:
        return self._t.run(Call("GET", f"/v1/datasets/{_id(id)}", _model(Dataset)))

    def list(self) -> builtins.list[Dataset]:
        return self._t.run(_paged("/v1/datasets", Dataset))

    def rows(self, id: str, version: int | None = None) -> tuple[int, builtins.list[DatasetItem]]:
        params = {} if version is None else {"version": version}
        response = self._t.send(Call("GET", f"/v1/datasets/{_id(id)}/rows", _model(dict), params=params))
        body = response.json()
        return body["version"], [DatasetItem.model_validate(item) for item in body["items"]]


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

    def execute(
        self, agent: Callable[[Any], Any], *, concurrency: int = 8, retries: int = 2, progress: bool | None = None,
    ) -> PendingRun:
        """Call ``agent(row_input)`` on every row of the dataset version the run records - it
        returns the output, or an ``AgentAnswer`` with the spans of its run too; a bar on stderr
        shows the rows done when it is a terminal (or as ``progress`` says)."""
        _, items = Datasets(self._t).rows(self.run.dataset_id, self.run.dataset_version)
        bar = _Progress(len(items), sys.stderr.isatty() if progress is None else progress)
        outputs = call_agent(agent, items, concurrency=concurrency, retries=retries, bar=bar)
        self._outputs.update(outputs)
        return self

    def finalize(self) -> Evaluation:
        """Upload the outputs; the server grades them and answers the completed run."""
        outputs = [self._outputs.get(i, {"row": i, "error": "not executed"}) for i in range(self.run.row_count)]
        path = f"/v1/evaluations/{_id(self.run.id)}/finalize"
        run = self._t.run(Call("POST", path, _model(EvaluationRun), json={"outputs": outputs}))
        return Evaluation(run)


class Evaluations:
    """``client.evaluations``."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    def run(
        self, dataset_id: str, subject: Mapping[str, Any], scorer_group_id: str | None = None,
        scorer_id: str | None = None, additional_scorer_ids: Sequence[str] | None = None,
        dataset_version: int | None = None, cache: bool = True,
    ) -> PendingRun:
        """A run of the dataset's latest version (or ``dataset_version``). The group wins when
        both ``scorer_group_id`` and ``scorer_id`` are given, and nulls ``additional_scorer_ids``
        (the run's ``warnings`` say so, and are printed). ``cache=False``: every judge asked
        afresh (verdicts already paid for are neither read nor kept)."""
        body: dict[str, Any] = {"datasetId": dataset_id, "subject": dict(subject)}
        if not cache:
            body["cache"] = False
        additional = None if additional_scorer_ids is None else list(additional_scorer_ids)
        for key, value in (("scorerGroupId", scorer_group_id), ("scorerId", scorer_id),
                           ("additionalScorerIds", additional), ("datasetVersion", dataset_version)):
            if value is not None:
                body[key] = value
        run = self._t.run(Call("POST", "/v1/evaluations", _model(EvaluationRun), json=body))
        return PendingRun(self._t, run)

    def get(self, id: str) -> Evaluation:
        run = self._t.run(Call("GET", f"/v1/evaluations/{_id(id)}", _model(EvaluationRun)))
        return Evaluation(run)

    def list(self) -> builtins.list[EvaluationRun]:
        return self._t.run(_paged("/v1/evaluations", EvaluationRun))

    def calls(self, id: str, row: int) -> RowCalls:
        """The judge calls behind one row of a completed run: what each judge was sent and
        answered (``note`` says why there are none)."""
        return self._t.run(Call("GET", f"/v1/evaluations/{_id(id)}/rows/{int(row)}/calls", _model(RowCalls)))
