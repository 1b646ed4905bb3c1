"""Incidents: a group's incidents, open ones first, as the watcher records them
(``consumers.incidents``), a page at a time. Another project's group is a 404, as everywhere."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from adapters.stores.incidents import IncidentStore
from scorer_groups.api_models import Incident, Incidents, Level
from scoring.models import ID_PATTERN
from worker.api.auth import Client, redis_of
from worker.api.pages import Limit, OffsetCursor

router = APIRouter(prefix="/v1", tags=["incidents"])

GroupId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]


@router.get("/scorer-groups/{id}/incidents", response_model=Incidents)
async def group_incidents(group_id: GroupId, client: Client, request: Request, limit: Limit = 50,
                          cursor: OffsetCursor = None) -> Incidents:
    """A page of the group's incidents, open ones first, then the newest; and its learned level.
    The cursor is a place in that order: an incident opened meanwhile shifts it by one."""
    group = await client.scorer_groups.get(group_id)  # 404 for another project's
    store = IncidentStore(redis_of(request))
    found = [Incident.model_validate(r) for r in await store.incidents(group.id)]
    found.sort(key=lambda i: (i.state != "open", -i.opened_at.timestamp(), i.id))
    start = int(cursor or 0)
    learned = await store.level(group.id)
    level = Level(mean=learned.mean, spread=learned.spread, windows=learned.learned) if learned.learned else None
    following = str(start + limit) if start + limit < len(found) else None
    return Incidents(incidents=found[start:start + limit], level=level, next_cursor=following)
