"""Who is calling: ``Authorization: Bearer <key>`` looked up on every request (so a revoked key
is refused at once) - by the door, before the body is read (``worker.api.door``) - turned into
the ``Caller`` the catalog surface is scoped to."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from adapters.stores.apikeys import ApiKeyStore
from adapters.stores.client import RedisClient
from services.groups import Caller, MonitorClient

bearer = HTTPBearer(auto_error=False, description="An API key from `scorer-worker keys create`.")
CHALLENGE = {"WWW-Authenticate": "Bearer"}


def redis_of(request: Request) -> RedisClient:
    redis: RedisClient = request.app.state.redis
    return redis


async def caller(request: Request,
                 credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> Caller:
    key = getattr(request.state, "api_key", None)  # checked at the door (worker.api.door), before the body
    if key is None:
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise HTTPException(401, "send an API key as 'Authorization: Bearer <key>'", headers=CHALLENGE)
        key = await ApiKeyStore(redis_of(request)).authenticate(credentials.credentials)
    if key is None:
        raise HTTPException(401, "the API key is unknown or revoked", headers=CHALLENGE)
    request.state.key_id = key.id
    return Caller(project_id=key.project, actor=key.label(), key_id=key.id, name=key.name, role=key.role)


async def client(request: Request, who: Annotated[Caller, Depends(caller)]) -> MonitorClient:
    """The catalog surface, scoped to the caller's project."""
    return MonitorClient(redis_of(request), who, cache=request.app.state.snapshots,
                         limits=request.app.state.settings.catalog_limits())


Client = Annotated[MonitorClient, Depends(client)]
Who = Annotated[Caller, Depends(caller)]
