"""What each SDK method sends and how it reads the answer - written once, run by the sync
client and its async twin alike (``_sync``, ``_async``)."""

from __future__ import annotations

import builtins
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter
from pydantic.alias_generators import to_camel

from scorer_groups.alignments import Alignment
from scorer_groups.api_models import (
    BackfillEstimate,
    BackfillEstimateAnswer,
    BackfillJob,
    Change,
    Channel,
    GradeRequest,
    Incidents,
    JudgeCallRecord,
    JudgeTemplates,
    PlaygroundRating,
    Ratings,
    RatingWithCalls,
    ResultsPage,
    SessionScore,
)
from scorer_groups.errors import ApiError, error_for
from scorer_groups.models import Budget, CustomEvaluator, Judge, JudgeExample, Pattern, ScorerGroup, WireModel
from scorer_groups.review_queues import (
    AddedItems,
    ItemPage,
    ItemView,
    Labelled,
    LiveAgreement,
    ReviewProgress,
    ReviewQueue,
)
from scorer_groups.runs import Dataset

T = TypeVar("T")
RETRY_STATUSES = (429, 503)
PAGE_SIZE = 200


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how its answer becomes a value."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    item: TypeAdapter[Any] | None = None  # a list: follow nextCursor to the last page, read each item

    def page_items(self, response: httpx.Response) -> tuple[builtins.list[Any], str | None]:
        assert self.item is not None
        body = response.json()
        return [self.item.validate_python(x) for x in body["items"]], body.get("nextCursor")


@dataclass(frozen=True)
class Retry:
    """Retries on 429 and 503: ``Retry-After`` when the server gives one (capped), otherwise
    exponential backoff with jitter."""

    attempts: int = 3
    backoff_s: float = 0.5
    max_wait_s: float = 30.0

    def delay(self, attempt: int, response: httpx.Response) -> float | None:
        """Seconds to wait before retrying, or None to give up."""
        if response.status_code not in RETRY_STATUSES or attempt >= self.attempts:
            return None
        after = response.headers.get("retry-after", "")
        if after.isdigit():
            return min(float(after), self.max_wait_s)
        return min(self.backoff_s * float(2 ** attempt) * (1 + random.random() / 4), self.max_wait_s)


def raise_for_problem(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        problem = response.json()
        if not isinstance(problem, dict):
            raise ValueError
    except ValueError:
        problem = {"status": response.status_code, "detail": response.text[:1000]}
    raise error_for(response.status_code, problem)


def _model(model: type[T]) -> Callable[[httpx.Response], T]:
    adapter = TypeAdapter(model)
    return lambda response: adapter.validate_json(response.content)


def _nothing(_: httpx.Response) -> None:
    return None


def _paged(path: str, model: Any) -> Call[Any]:
    return Call("GET", path, _nothing, item=TypeAdapter(model))


def _wire(value: Any) -> Any:
    """SDK arguments as JSON: models by their wire form, snake_case keys to camelCase."""
    if isinstance(value, WireModel):
        return value.wire()
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, Mapping):
        return {to_camel(str(k)) if "_" in str(k) else str(k): _wire(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_wire(v) for v in value]
    return value


def _id(value: str) -> str:
    return quote(str(value), safe="")


def _if_match(etag: str | None) -> dict[str, str]:
    return {"If-Match": etag} if etag else {}


# --- /v1/scorer-groups and /v1/sessions -------------------------------------------------------


def list_groups() -> Call[builtins.list[ScorerGroup]]:
    return _paged("/v1/scorer-groups", ScorerGroup)


def get_group(group_id: str) -> Call[ScorerGroup]:
    return Call("GET", f"/v1/scorer-groups/{_id(group_id)}", _model(ScorerGroup))


def create_group(name: str, members: Sequence[Any], description: str | None, online: Any,
                 extra: Mapping[str, Any]) -> Call[ScorerGroup]:
    body = {"name": name, "members": _wire(list(members)), "description": description,
            "online": _wire(online), **_wire(dict(extra))}
    return Call("POST", "/v1/scorer-groups", _model(ScorerGroup), json=body)


def update_group(group_id: str, fields: Mapping[str, Any], if_match: str | None) -> Call[ScorerGroup]:
    """Sparse: only the fields given are sent; ``online`` is merged key by key by the server,
    and ``online=None`` detaches live scoring."""
    return Call("PATCH", f"/v1/scorer-groups/{_id(group_id)}", _model(ScorerGroup), json=_wire(dict(fields)),
                headers=_if_match(if_match))


def delete_group(group_id: str, if_match: str | None) -> Call[None]:
    return Call("DELETE", f"/v1/scorer-groups/{_id(group_id)}", _nothing, headers=_if_match(if_match))


def group_ratings(group_id: str, window: str) -> Call[Ratings]:
    return Call("GET", f"/v1/scorer-groups/{_id(group_id)}/ratings", _model(Ratings), params={"window": window})


def group_results(group_id: str, limit: int, cursor: str | None, below: bool) -> Call[ResultsPage]:
    params: dict[str, Any] = {"limit": limit, "below": "true" if below else "false"}
    if cursor is not None:
        params["cursor"] = cursor
    return Call("GET", f"/v1/scorer-groups/{_id(group_id)}/results", _model(ResultsPage), params=params)


def group_incidents(group_id: str, limit: int, cursor: str | None) -> Call[Incidents]:
    params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor is not None else {})}
    return Call("GET", f"/v1/scorer-groups/{_id(group_id)}/incidents", _model(Incidents), params=params)


def judge_templates() -> Call[JudgeTemplates]:
    return Call("GET", "/v1/judge-templates", _model(JudgeTemplates))


def group_result(group_id: str, rating_id: str) -> Call[RatingWithCalls]:
    return Call("GET", f"/v1/scorer-groups/{_id(group_id)}/results/{_id(rating_id)}", _model(RatingWithCalls))


def grade_example(group_id: str, example: GradeRequest) -> Call[PlaygroundRating]:
    return Call("POST", f"/v1/scorer-groups/{_id(group_id)}/grade", _model(PlaygroundRating),
                json=example.model_dump(mode="json", by_alias=True, exclude_none=True))


def group_changes(group_id: str) -> Call[builtins.list[Change]]:
    return _paged(f"/v1/scorer-groups/{_id(group_id)}/changes", Change)


def session_scores(session_id: str) -> Call[builtins.list[SessionScore]]:
    return Call("GET", f"/v1/sessions/{_id(session_id)}/scores", _model(builtins.list[SessionScore]))



# --- Backfills: /v1/scorer-groups/{id}/backfills and /v1/backfills/{id} ----------------------


def start_backfill(group_id: str, body: Mapping[str, Any]) -> Call[BackfillJob]:
    """``body``: ``backfills.backfill_body``'s (the window, sample, caps), checked by the server."""
    return Call("POST", f"/v1/scorer-groups/{_id(group_id)}/backfills", _model(BackfillJob), json=dict(body))


def estimate_backfill(group_id: str, body: Mapping[str, Any]) -> Call[BackfillEstimate]:
    """The same request as a dry run: what the job would grade and spend; nothing started."""
    return Call("POST", f"/v1/scorer-groups/{_id(group_id)}/backfills",
                lambda response: BackfillEstimateAnswer.model_validate_json(response.content).estimate,
                json={**body, "dryRun": True})


def group_backfills(group_id: str) -> Call[builtins.list[BackfillJob]]:
    # One answer, not pages: the server keeps a group's last 50 jobs.
    return Call("GET", f"/v1/scorer-groups/{_id(group_id)}/backfills", _model(builtins.list[BackfillJob]))


def get_backfill(job_id: str) -> Call[BackfillJob]:
    return Call("GET", f"/v1/backfills/{_id(job_id)}", _model(BackfillJob))


def cancel_backfill(job_id: str) -> Call[BackfillJob]:
    return Call("DELETE", f"/v1/backfills/{_id(job_id)}", _model(BackfillJob))

# --- Scorers, budgets, channels ---------------------------------------------------------------

SCORER_PATHS: dict[type[WireModel], str] = {Judge: "judges", Pattern: "patterns", CustomEvaluator: "customs"}


def list_docs(model: type[T], path: str) -> Call[builtins.list[T]]:
    return _paged(f"/v1/{path}", model)


def get_doc(model: type[T], path: str, id_: str) -> Call[T]:
    return Call("GET", f"/v1/{path}/{_id(id_)}", _model(model))


def create_doc(model: type[T], path: str, fields: Mapping[str, Any]) -> Call[T]:
    return Call("POST", f"/v1/{path}", _model(model), json=_wire(dict(fields)))


def replace_doc(model: type[T], path: str, id_: str, body: Mapping[str, Any], if_match: str | None) -> Call[T]:
    return Call("PUT", f"/v1/{path}/{_id(id_)}", _model(model), json=_wire(dict(body)), headers=_if_match(if_match))


def delete_doc(path: str, id_: str, if_match: str | None = None) -> Call[None]:
    return Call("DELETE", f"/v1/{path}/{_id(id_)}", _nothing, headers=_if_match(if_match))


def merged(stored: WireModel, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A stored scorer with ``fields`` put over it, as a PUT body (the server picks the id)."""
    body = {k: v for k, v in stored.wire().items() if k != "id"}
    return {**body, **_wire(dict(fields))}


def put_budget(project_id: str, judge_calls_per_window: int, window_seconds: int | None,
               judge_tokens_per_window: int | None = None) -> Call[Budget]:
    body: dict[str, Any] = {"judgeCallsPerWindow": judge_calls_per_window,
                            "judgeTokensPerWindow": judge_tokens_per_window}
    if window_seconds is not None:  # unsent: the stored window (a project key may not change it)
        body["windowSeconds"] = window_seconds
    return Call("PUT", f"/v1/budgets/{_id(project_id)}", _model(Budget), json=body)


def create_channel(agent_id: str, url: str, secret: str | None, extra: Mapping[str, Any]) -> Call[Channel]:
    return Call("POST", "/v1/channels", _model(Channel),
                json={"agentId": agent_id, "url": url, "secret": secret, **_wire(dict(extra))})


__all__ = ["ApiError", "Call", "Retry"]


# --- a judge's examples ------------------------------------------------------------


def judge_examples(judge_id: str) -> Call[builtins.list[JudgeExample]]:
    return Call("GET", f"/v1/judges/{_id(judge_id)}/examples", _model(builtins.list[JudgeExample]))


def add_judge_example(judge_id: str, body: Mapping[str, Any]) -> Call[JudgeExample]:
    return Call("POST", f"/v1/judges/{_id(judge_id)}/examples", _model(JudgeExample), json=dict(body))


def delete_judge_example(judge_id: str, example_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/judges/{_id(judge_id)}/examples/{_id(example_id)}", _nothing)


def start_alignment(judge_id: str, body: Mapping[str, Any]) -> Call[Alignment]:
    return Call("POST", f"/v1/judges/{_id(judge_id)}/alignments", _model(Alignment), json=_wire(dict(body)))


def get_alignment(judge_id: str, alignment_id: str) -> Call[Alignment]:
    return Call("GET", f"/v1/judges/{_id(judge_id)}/alignments/{_id(alignment_id)}", _model(Alignment))


def list_alignments(judge_id: str) -> Call[builtins.list[Alignment]]:
    return Call("GET", f"/v1/judges/{_id(judge_id)}/alignments", _model(builtins.list[Alignment]))


def promote_judge(judge_id: str, alignment_id: str, force: bool) -> Call[Judge]:
    return Call("POST", f"/v1/judges/{_id(judge_id)}/promote", _model(Judge),
                json={"alignment": alignment_id, "force": force})


# --- /v1/review-queues and /v1/review-items ----------------------------------------


def list_queues() -> Call[builtins.list[ReviewQueue]]:
    return _paged("/v1/review-queues", ReviewQueue)


def get_queue(queue_id: str) -> Call[ReviewQueue]:
    return Call("GET", f"/v1/review-queues/{_id(queue_id)}", _model(ReviewQueue))


def create_queue(fields: Mapping[str, Any]) -> Call[ReviewQueue]:
    return Call("POST", "/v1/review-queues", _model(ReviewQueue), json=_wire(dict(fields)))


def update_queue(queue_id: str, fields: Mapping[str, Any], if_match: str | None) -> Call[ReviewQueue]:
    """Sparse, as a group's: ``rule`` merges key by key, a key sent as None gets its default back."""
    return Call("PATCH", f"/v1/review-queues/{_id(queue_id)}", _model(ReviewQueue), json=_wire(dict(fields)),
                headers=_if_match(if_match))


def queue_items(queue_id: str, state: str, limit: int, cursor: str | None) -> Call[ItemPage]:
    params: dict[str, Any] = {"state": state, "limit": limit, **({"cursor": cursor} if cursor else {})}
    return Call("GET", f"/v1/review-queues/{_id(queue_id)}/items", _model(ItemPage), params=params)


def add_items(queue_id: str, rating_ids: Sequence[str], group_id: str | None) -> Call[AddedItems]:
    body: dict[str, Any] = {"ratingIds": list(rating_ids), **({"groupId": group_id} if group_id else {})}
    return Call("POST", f"/v1/review-queues/{_id(queue_id)}/items", _model(AddedItems), json=body)


def item_calls(item_id: str) -> Call[builtins.list[JudgeCallRecord]]:
    return Call("GET", f"/v1/review-items/{_id(item_id)}/calls", _model(builtins.list[JudgeCallRecord]))


def queue_progress(queue_id: str) -> Call[ReviewProgress]:
    return Call("GET", f"/v1/review-queues/{_id(queue_id)}/progress", _model(ReviewProgress))


def next_item(queue_id: str) -> Call[ItemView | None]:
    parse = _model(ItemView)
    return Call("POST", f"/v1/review-queues/{_id(queue_id)}/next",
                lambda response: None if response.status_code == 204 else parse(response))


def get_item(item_id: str) -> Call[ItemView]:
    return Call("GET", f"/v1/review-items/{_id(item_id)}", _model(ItemView))


def label_item(item_id: str, rating: float, members: Mapping[str, Any] | None, comment: str | None) -> Call[Labelled]:
    """``members`` is keyed by ref ids, which are the tenant's own names: sent as given."""
    body: dict[str, Any] = {"rating": rating}
    if members:
        body["members"] = {str(ref): _wire(verdict) for ref, verdict in members.items()}
    if comment is not None:
        body["comment"] = comment
    return Call("PUT", f"/v1/review-items/{_id(item_id)}/labels/me", _model(Labelled), json=body)


def export_queue(queue_id: str, body: Mapping[str, Any]) -> Call[Dataset]:
    return Call("POST", f"/v1/review-queues/{_id(queue_id)}/export", _model(Dataset), json=_wire(dict(body)))


def group_agreement(group_id: str) -> Call[LiveAgreement]:
    return Call("GET", f"/v1/scorer-groups/{_id(group_id)}/agreement", _model(LiveAgreement))
