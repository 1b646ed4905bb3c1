"""``client.judge_examples``: the graded examples a judge's prompt shows it - people's
corrections made part of the rubric. An example is written by hand, or taken in one call from a
labelled review item (its texts, the median of its reviewers' ratings, the first comment as why)
or from a dataset row with a ``humanRating`` and an ``output``.

Examples live in the judge's document: adding or removing one is a change of the judge, by
whoever may change it (operators for a shared judge), made as one optimistic write - read, add,
write if the judge is still the one read (``If-Match``), again on a race. A changed set is a new
rubric revision (``CatalogIndex.revision`` hashes the judge): backfills grade again, and a
verdict of the old set is never taken for the new one.
"""

from __future__ import annotations

import builtins
import statistics
import uuid
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from adapters.stores.catalog import CatalogStore
from adapters.stores.datasets import DatasetStore
from adapters.stores.review_items import ReviewItems
from scorer_groups.alignments import JudgeDisagreement
from scorer_groups.models import EXAMPLE_REASON_MAX_CHARS, EXAMPLE_TEXT_MAX_CHARS, JudgeExample
from scoring.catalog import etag
from scoring.errors import Conflict, InvalidDocument, NotFound, PreconditionFailed
from scoring.models import Judge
from scoring.review_rules import review_item_id
from scoring.subjects import as_text
from services.groups import Caller, Scorers
from services.review_queues import ReviewQueues

WRITE_TRIES = 3
DISAGREEMENTS_SHOWN = 20  # an optimistic write lost to a concurrent change of the judge is made again


def _cut(text: str, limit: int) -> str:
    marker = " [...cut]"
    return text if len(text) <= limit else text[:limit - len(marker)] + marker


class JudgeExamples:
    def __init__(self, store: CatalogStore, caller: Caller, max_examples: int) -> None:
        self._store, self._caller, self._max = store, caller, max_examples
        self._scorers = Scorers(store, caller)

    async def list(self, judge_id: str) -> builtins.list[JudgeExample]:
        return list((await self._judge(judge_id)).examples)

    async def add(self, judge_id: str, fields: Mapping[str, Any]) -> JudgeExample:
        """``fields``: ``input``, ``output``, ``rating``, ``reason``? - or ``fromItem`` (a review
        item's id), or ``fromRow`` (``{"dataset", "row", "version"?}``)."""
        judge = await self._judge(judge_id)
        example = await self._example(judge, fields)
        for _ in range(WRITE_TRIES):
            if len(judge.examples) >= self._max:
                raise Conflict(f"examples: judge {judge.id!r} keeps at most {self._max} examples "
                               "(SGW_JUDGE_MAX_EXAMPLES); delete one first")
            changed = judge.model_copy(update={"examples": [*judge.examples, example]})
            try:
                await self._scorers.put(changed, if_match=etag(judge))
                return example
            except PreconditionFailed:  # changed since read: add to what it is now
                judge = await self._judge(judge_id)
        raise Conflict(f"judge {judge_id!r} kept changing while the example was added; try again")

    async def delete(self, judge_id: str, example_id: str) -> None:
        for _ in range(WRITE_TRIES):
            judge = await self._judge(judge_id)
            kept = [e for e in judge.examples if e.id != example_id]
            if len(kept) == len(judge.examples):
                raise NotFound(f"judge {judge_id!r} has no example {example_id!r}")
            try:
                await self._scorers.put(judge.model_copy(update={"examples": kept}), if_match=etag(judge))
                return
            except PreconditionFailed:
                continue
        raise Conflict(f"judge {judge_id!r} kept changing while the example was deleted; try again")

    async def disagreements(self, judge_id: str,
                            limit: int = DISAGREEMENTS_SHOWN) -> builtins.list[JudgeDisagreement]:
        """The labelled review items of the caller's queues whose results this judge graded, where
        it and people are furthest apart, the largest gap first."""
        judge = await self._judge(judge_id)
        snapshot = await self._store.snapshot()
        items = ReviewItems(self._store.redis)
        found = []
        for queue in snapshot.queues.values():
            if not self._caller.sees("queues", queue) or (judge.project_id not in (None, queue.project_id)):
                continue
            groups = [snapshot.groups.get(g) for g in queue.group_ids]
            if not any(g is not None and any(m.ref_id == judge.id for m in g.members if m.kind == "judge")
                       for g in groups):
                continue
            for card, labels in await items.labelled(queue):
                verdict = card.judges.get(judge.id)
                if verdict is None or not labels:
                    continue
                people = statistics.median(float(label["rating"]) for label in labels.values())  # type: ignore[arg-type]
                found.append((abs(verdict - people), queue, card, verdict, people, len(labels)))
        found.sort(key=lambda f: -f[0])
        shown = []
        for gap, queue, card, verdict, people, count in found[:limit]:
            item_id = review_item_id(queue.id, card.rating_id)
            view = await items.view(queue, item_id)
            subject = view[0].subject if view is not None else None
            shown.append(JudgeDisagreement(
                item_id=item_id, queue_id=queue.id, group_id=card.group_id, judge=verdict, people=people,
                gap=round(gap, 4), labels=count,
                input=((subject.transcript or subject.input) if subject else "")[:300],
                output=(subject.output if subject else "")[:300]))
        return shown

    async def _judge(self, judge_id: str) -> Judge:
        judge = await self._scorers.get("judges", judge_id)
        assert isinstance(judge, Judge)
        return judge

    async def _example(self, judge: Judge, fields: Mapping[str, Any]) -> JudgeExample:
        given = {k: v for k, v in fields.items() if v is not None}
        sources = [k for k in ("fromItem", "fromRow") if k in given]
        if len(sources) > 1 or (sources and {"input", "output", "rating"} & given.keys()):
            raise InvalidDocument("fromItem: send an example's input, output and rating, or fromItem, or fromRow - "
                                  "one of them")
        if "fromItem" in given:
            given = await self._from_item(judge, str(given["fromItem"]))
        elif "fromRow" in given:
            given = await self._from_row(judge, given["fromRow"])
        try:
            return JudgeExample.model_validate({**given, "id": f"ex_{uuid.uuid4().hex[:12]}"})
        except ValidationError as exc:
            raise InvalidDocument.from_validation(exc) from None

    async def _from_item(self, judge: Judge, item_id: str) -> dict[str, Any]:
        if judge.project_id is None:  # a shared judge's prompt reaches every project: no one project's texts
            raise InvalidDocument("fromItem: a shared judge learns from no project's items; write the example")
        view = await ReviewQueues(self._store, self._caller).view(item_id)  # 404: another project's
        item = view.item
        if item.project_id != judge.project_id:
            raise InvalidDocument(f"fromItem: an item of project {item.project_id!r} cannot teach a judge of "
                                  f"project {judge.project_id!r}")
        text = item.subject.transcript or item.subject.input
        if not text:
            raise InvalidDocument("fromItem: the item carries no texts (it was added by hand): nothing to show")
        if not view.labels:
            raise InvalidDocument("fromItem: nobody labelled the item yet")
        comments = [label.comment for label in view.labels if label.comment]
        return {"input": _cut(text, EXAMPLE_TEXT_MAX_CHARS),
                "output": _cut(item.subject.output, EXAMPLE_TEXT_MAX_CHARS),
                "rating": statistics.median(label.rating for label in view.labels),
                "reason": _cut(comments[0], EXAMPLE_REASON_MAX_CHARS) if comments else None, "source": item.id}

    async def _from_row(self, judge: Judge, where: Any) -> dict[str, Any]:
        if not isinstance(where, Mapping) or not isinstance(where.get("dataset"), str) \
                or not isinstance(where.get("row"), int) or isinstance(where.get("row"), bool):
            raise InvalidDocument('fromRow: {"dataset": "<id>", "row": <number>, "version"?: <number>}')
        project = judge.project_id or self._caller.project_id  # a shared judge: the caller's project's rows
        if project is None:
            raise InvalidDocument("fromRow: a shared judge has no project's datasets to read; write the example")
        version, rows = await DatasetStore(self._store.redis).rows(project, where["dataset"], where.get("version"))
        if not 0 <= where["row"] < len(rows):
            raise InvalidDocument(f"fromRow.row: dataset {where['dataset']!r} version {version} has {len(rows)} rows")
        row = rows[where["row"]]
        if row.human_rating is None or row.output is None:
            raise InvalidDocument("fromRow: the row needs a humanRating and an output (a review queue's export has "
                                  "both)")
        return {"input": _cut(as_text(row.input), EXAMPLE_TEXT_MAX_CHARS),
                "output": _cut(row.output, EXAMPLE_TEXT_MAX_CHARS), "rating": row.human_rating,
                "source": f"{where['dataset']}:{version}:{where['row']}"}
