"""Backfills: start, read and cancel a job that grades a group's past traffic.

A job is stored with its window and its sample; the workers' runner (``consumers.backfill``)
reads the window's range of the traces topic again. What a request may ask of a group is
decided in one place (``adapters.stores.backfills.backfill_sample``), for this API and the CLI.
Jobs are the caller's project's: another project's job is a 404, as its groups are.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from adapters.stores.backfills import BackfillStore
from scorer_groups.api_models import BackfillCreate, BackfillEstimateAnswer, BackfillJob
from scoring.models import ID_PATTERN
from worker.api.auth import Client, Who, redis_of
from worker.backfill_estimates import backfill_estimate

router = APIRouter(prefix="/v1", tags=["backfills"])

GroupId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]
JobId = Annotated[str, Path(alias="id", max_length=64, pattern=r"^bf-[0-9a-f]{16}$")]


@router.post("/scorer-groups/{id}/backfills", status_code=202, response_model=BackfillJob | BackfillEstimateAnswer,
             responses={200: {"model": BackfillEstimateAnswer, "description": "dryRun: the estimate, no job"}})
async def start_backfill(group_id: GroupId, body: BackfillCreate, client: Client, who: Who, request: Request,
                         response: Response) -> BackfillJob | BackfillEstimateAnswer:
    """Grade the group's traffic of ``[from, to)`` again, with its current version: 202 and the
    job, queued. ``sampleRate`` defaults to the group's online one (required without one). With
    ``dryRun``: 200 and what the job would grade and spend, and nothing started or spent."""
    if body.dry_run:  # within the project's share of the dry runs at once: each reads the topic
        response.status_code = 200
        async with request.app.state.estimates.slot(who.project_id or "operators"):
            return BackfillEstimateAnswer(
                estimate=await backfill_estimate(client, request.app.state.settings, group_id, body))
    group = await client.scorer_groups.get(group_id)  # 404 for another project's
    return await BackfillStore(redis_of(request)).start(group, body)


@router.get("/scorer-groups/{id}/backfills", response_model=list[BackfillJob])
async def group_backfills(group_id: GroupId, client: Client, request: Request) -> list[BackfillJob]:
    """The group's jobs, newest first (the last 50)."""
    group = await client.scorer_groups.get(group_id)
    return await BackfillStore(redis_of(request)).of_group(group.id)


@router.get("/backfills/{id}", response_model=BackfillJob)
async def get_backfill(job_id: JobId, who: Who, request: Request) -> BackfillJob:
    return await BackfillStore(redis_of(request)).get(job_id, who.project_id)


@router.delete("/backfills/{id}", response_model=BackfillJob)
async def cancel_backfill(job_id: JobId, who: Who, request: Request) -> BackfillJob:
    """Cancel a job that has not ended (409 if it has): the runner stops at its next batch."""
    return await BackfillStore(redis_of(request)).cancel(job_id, who.project_id)
