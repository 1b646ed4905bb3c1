"""``/v1/scorer-groups`` and ``/v1/sessions``: the spec's SDK surface over HTTP.

Every handler is a thin shell around ``services.groups`` (the same code ``catalog apply`` and the
CLI use), so the rules - limits, unknown refs, ``requiresExpected`` on a live group, the sparse
``online`` merge - hold the same whichever way a change arrives.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Path, Query, Request, Response

from adapters.stores.changes import ChangeLog
from scorer_groups.api_models import (
    MAX_EXAMPLE_EXTRAS_CHARS,
    Change,
    GradeRequest,
    PlaygroundRating,
    Ratings,
    RatingWithCalls,
    ResultsPage,
    SessionScore,
)
from scorer_groups.filters import Filter, SpanFilter
from scoring.catalog import etag
from scoring.errors import NotFound
from scoring.models import (
    ID_PATTERN,
    AlertMode,
    Id,
    Member,
    Name,
    OnlineProfile,
    Scope,
    ScorerGroup,
    Severity,
    WireModel,
)
from services.groups import Caller, MonitorClient
from services.playground import Playground, passes_filter
from worker.api.auth import Client, Who, redis_of
from worker.api.bodies import body_doc, read_body
from worker.api.pages import Cursor, Limit, OffsetCursor, Page, page
from worker.api.problems import Problem

router = APIRouter(prefix="/v1", tags=["scorer groups"])
IfMatch = Annotated[str | None, Header(description="An ETag from a read: the write fails with 412 if "
                                                   "the document changed since.")]
GroupId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]
RatingId = Annotated[str, Path(alias="ratingId", max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")]


class GroupCreate(WireModel):
    """A new group. ``projectId`` is the key's project (an operator key names one)."""

    name: Name
    members: list[Member]
    description: str | None = None
    online: OnlineProfile | None = None
    project_id: Id | None = None
    gates_first: bool = False


class OnlinePatch(WireModel):
    """Keys to merge into the stored online profile; omitted keys keep their stored values."""

    enabled: bool | None = None
    sample_rate: float | None = None
    sample_salt: str | None = None  # null: back to the shared sample
    alert_threshold: float | None = None
    severity: Severity | None = None
    scope: Scope | None = None
    idle_seconds: int | None = None
    alert_on_no_score: bool | None = None
    filter: Filter | None = None  # null: the group sees all its project's traffic again
    span_filter: SpanFilter | None = None  # span scope's; null removes it
    alert_mode: AlertMode | None = None
    alert_window_seconds: int | None = None
    alert_min_results: int | None = None
    alert_resolve_above: float | None = None  # null: back to alertThreshold
    alert_no_score_rate: float | None = None  # null: no coverage incidents
    alert_drift_sigma: float | None = None


class GroupPatch(WireModel):
    """A sparse update: only the fields sent change; ``online: null`` detaches live scoring."""

    name: Name | None = None
    members: list[Member] | None = None
    description: str | None = None
    online: OnlinePatch | None = None
    project_id: Id | None = None
    gates_first: bool | None = None


class GroupPage(Page):
    items: list[ScorerGroup]


class ChangePage(Page):
    items: list[Change]


def _with_etag(response: Response, group: ScorerGroup) -> ScorerGroup:
    response.headers["ETag"] = etag(group)
    return group


@router.get("/scorer-groups", response_model=GroupPage)
async def list_groups(client: Client, limit: Limit = 50, cursor: Cursor = None) -> GroupPage:
    groups = await client.scorer_groups.list()
    items, next_cursor = page(groups, lambda g: g.id, limit, cursor)
    return GroupPage(items=items, next_cursor=next_cursor)


@router.post("/scorer-groups", status_code=201, response_model=ScorerGroup)
async def create_group(body: GroupCreate, client: Client, request: Request, response: Response) -> ScorerGroup:
    group = await client.scorer_groups.create(body.name, body.members, body.description, body.online,
                                              project_id=body.project_id, gates_first=body.gates_first)
    response.headers["Location"] = str(request.url_for("get_group", id=group.id).path)
    return _with_etag(response, group)


@router.get("/scorer-groups/{id}", response_model=ScorerGroup)
async def get_group(group_id: GroupId, client: Client, response: Response) -> ScorerGroup:
    return _with_etag(response, await client.scorer_groups.get(group_id))


@router.patch("/scorer-groups/{id}", response_model=ScorerGroup)
async def update_group(group_id: GroupId, body: GroupPatch, client: Client, response: Response,
                       if_match: IfMatch = None) -> ScorerGroup:
    fields: dict[str, Any] = {}
    for name in body.model_fields_set:
        if name == "online":
            fields[name] = None if body.online is None else body.online.model_dump(by_alias=True,
                                                                                    exclude_unset=True)
        elif name == "members":
            fields[name] = None if body.members is None else [m.wire() for m in body.members]
        else:
            fields[name] = getattr(body, name)
    group = await client.scorer_groups.update(group_id, if_match=if_match, **fields)
    return _with_etag(response, group)


@router.delete("/scorer-groups/{id}", status_code=204, response_class=Response)
async def delete_group(group_id: GroupId, client: Client, if_match: IfMatch = None) -> Response:
    await client.scorer_groups.delete(group_id, if_match=if_match)
    return Response(status_code=204)


@router.get("/scorer-groups/{id}/ratings", response_model=Ratings)
async def group_ratings(group_id: GroupId, client: Client, request: Request,
                        window: Literal["1h", "24h", "7d", "30d"] = "7d") -> dict[str, object]:
    history = (await client.scorer_groups.ratings(group_id, window=window)).wire()
    return {**history, "currency": request.app.state.settings.currency}


@router.get("/scorer-groups/{id}/results", response_model=ResultsPage)
async def group_results(group_id: GroupId, client: Client, limit: Limit = 50, cursor: Cursor = None,
                        below: Annotated[bool, Query(description="Only results below the alert threshold.")] = False
                        ) -> ResultsPage:
    """The group's latest results (trace and session scope), newest first: each the rating as
    published - score, justification, members. The last 1,000 are kept."""
    return await client.scorer_groups.results(group_id, limit=limit, cursor=cursor, below=below)


@router.get("/scorer-groups/{id}/results/{ratingId}", response_model=RatingWithCalls)
async def group_result(group_id: GroupId, rating_id: RatingId, client: Client) -> RatingWithCalls:
    """One of the group's latest results, with the judge calls behind it: each judge's model,
    the exact messages it was sent and its answer (cut at 4,000 characters with their full
    lengths, secrets masked), latency, attempts and tokens. 404 once the latest results no
    longer keep it."""
    return await client.scorer_groups.result(group_id, rating_id)


# The playground's body: its extras' 1 MiB, and input and output at their worst escaped (a
# character outside the BMP is 12 bytes as JSON: two \\uXXXX escapes).
PLAYGROUND_BODY = MAX_EXAMPLE_EXTRAS_CHARS + 2 * 100_000 * 12 + 64 * 1024


@router.post("/scorer-groups/{id}/grade", response_model=PlaygroundRating,
             openapi_extra=body_doc(GradeRequest, PLAYGROUND_BODY),
             responses={429: {"model": Problem, "description": "No room in the judge budget (the problem's "
                                                               "`budget` says its state), or the project's "
                                                               "playground is busy."}})
async def grade_example(group_id: GroupId, client: Client, request: Request) -> PlaygroundRating:
    """The playground: grade one example with the group's members now and answer with the rating
    and every member's verdict, and whether live scoring would see the example (``passesFilter``,
    the group's ``online.filter``). Nothing is published; judge calls are reserved from the
    project's budget."""
    body: GradeRequest = await read_body(request, GradeRequest)
    group = await client.scorer_groups.get(group_id)
    snapshot = await client.store.snapshot()
    playground: Playground = request.app.state.playground
    rating, calls = await playground.grade(group, snapshot, body)
    return PlaygroundRating(**rating.model_dump(), passes_filter=passes_filter(group, body), calls=calls)


@router.get("/scorer-groups/{id}/changes", response_model=ChangePage)
async def group_changes(group_id: GroupId, client: Client, who: Who, request: Request,
                        limit: Limit = 50, cursor: OffsetCursor = None) -> dict[str, object]:
    """Every write to the group, newest first; still readable by its project once it is deleted."""
    return await changes_page(request, client, who, "groups", group_id, limit, cursor)


async def changes_page(request: Request, client: MonitorClient, who: Caller, kind: str, id_: str, limit: int,
                       cursor: str | None) -> dict[str, object]:
    """A page of a document's change log, for whoever may see the document - or, once it is
    deleted, for its last project (by the log's newest entry)."""
    log = ChangeLog(redis_of(request))
    try:
        await client.scorers.get(kind, id_)
    except NotFound:
        newest = await log.read(kind, id_, 0, 1)
        if not newest or not (who.operator or newest[0].get("projectId") == who.project_id):
            raise
    offset = int(cursor) if cursor else 0  # ASCII digits: OffsetCursor
    entries = await log.read(kind, id_, offset, limit + 1)
    more = len(entries) > limit
    return {"items": entries[:limit], "nextCursor": str(offset + limit) if more else None}


@router.get("/sessions/{sessionId}/scores", response_model=list[SessionScore], tags=["sessions"])
async def session_scores(session_id: Annotated[str, Path(alias="sessionId", max_length=256)],
                         client: Client) -> list[dict[str, object]]:
    """The latest verdict of each of the caller's groups on the session: an empty list while it
    has none - a conversation of one turn so far, still inside its idle window, or not seen -
    so a client polling after sending traces reads [] rather than catching an error. Another
    project's verdicts on a session of that id are never shown."""
    return await client.sessions.scores(session_id)
