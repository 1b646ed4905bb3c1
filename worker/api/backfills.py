"""Backfills (issue 42): start, read and cancel a job that grades a group's past traffic.

A job is stored with its window and its sample; the workers' runner (``consumers.backfill``)
reads the window's range of the traces topic again. Not yet: session- and span-scope groups,
``maxJudgeCalls`` and ``alerts`` are refused (400 naming them) rather than accepted and not
honoured. Jobs are the caller's project's: another project's job is a 404, as its groups are.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Path, Request

from scorer_groups.api_models import BackfillCreate, BackfillJob
from scoring.errors import InvalidDocument
from scoring.models import ID_PATTERN
from scoring.stores.backfills import BackfillStore
from worker.api.auth import Client, Who, redis_of

router = APIRouter(prefix="/v1", tags=["backfills"])

GroupId = Annotated[str, Path(alias="id", max_length=128, pattern=ID_PATTERN)]
JobId = Annotated[str, Path(alias="id", max_length=64, pattern=r"^bf-[0-9a-f]{16}$")]


@router.post("/scorer-groups/{id}/backfills", status_code=202, response_model=BackfillJob)
async def start_backfill(group_id: GroupId, body: BackfillCreate, client: Client, request: Request) -> BackfillJob:
    """Grade the group's traffic of ``[from, to)`` again, with its current version: 202 and the
    job, queued. ``sampleRate`` defaults to the group's online one (required without one)."""
    group = await client.scorer_groups.get(group_id)  # 404 for another project's
    refused = []
    if group.online is not None and group.online.scope != "trace":
        refused.append(f"scope: a {group.online.scope}-scope group cannot be backfilled yet: the runner grades "
                       "whole traces (conversations and single steps are the next step)")
    if body.max_judge_calls is not None:
        refused.append("maxJudgeCalls: not enforced yet; the project's judge budget bounds the job's calls")
    if body.alerts:
        refused.append("alerts: not yet: a backfill raises no Signal or delivery")
    if refused:
        raise InvalidDocument.of(refused)
    if body.to > datetime.now(UTC):
        raise InvalidDocument.of(["to: must not be in the future (a backfill grades traffic that already passed)"])
    rate = body.sample_rate if body.sample_rate is not None else (group.online.sample_rate if group.online else None)
    if rate is None:
        raise InvalidDocument.of(["sampleRate: required: the group has no online profile to take its sample from"])
    return await BackfillStore(redis_of(request)).create(group.id, group.project_id, body, rate)


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
