"""Incidents (issue 43): a group's incidents, open ones first, as the watcher records them
(``consumers.incidents``). Another project's group is a 404, as everywhere."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from scorer_groups.api_models import Incident
from scoring.models import ID_PATTERN
from scoring.stores.incidents import IncidentStore
from worker.api.auth import Client, redis_of

router = APIRouter(prefix="/v1", tags=["incidents"])

GroupId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]


@router.get("/scorer-groups/{id}/incidents", response_model=list[Incident])
async def group_incidents(group_id: GroupId, client: Client, request: Request) -> list[Incident]:
    """The group's incidents, open ones first, then the newest."""
    group = await client.scorer_groups.get(group_id)  # 404 for another project's
    found = [Incident.model_validate(r) for r in await IncidentStore(redis_of(request)).incidents(group.id)]
    return sorted(found, key=lambda i: (i.state != "open", -i.opened_at.timestamp()))
