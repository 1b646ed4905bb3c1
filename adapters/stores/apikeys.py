"""API keys: who may call the HTTP API, and for which project.

A key reads ``sgw_<keyId>_<secret>``; it is one project's, or an operator's (any project), and its ``role``
is ``admin`` or ``reviewer``. The one rule: Redis keeps only the SHA-256 of the whole key, never the key,
and every request looks its key up again, so a revoked key is refused at once. The rest:
docs/design-notes.md.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Literal

import orjson
from redis.exceptions import WatchError

from adapters.stores import keys
from adapters.stores.client import RedisClient
from scoring.errors import NotFound

PREFIX = "sgw"
Role = Literal["admin", "reviewer"]
ROLES: tuple[Role, ...] = ("admin", "reviewer")


@dataclass(frozen=True, slots=True)
class ApiKey:
    """What is stored about a key (never the key itself)."""

    id: str
    project: str | None  # None: an operator key
    name: str
    created_at: float
    revoked_at: float | None = None
    role: Role = "admin"  # absent from keys created before roles: admin, as they were

    @property
    def operator(self) -> bool:
        return self.project is None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def label(self) -> str:
        """How the change log names who made a change."""
        return f"key:{self.id} ({self.name})"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _parse(token: str) -> str | None:
    """The key id of a well-formed token, else None."""
    parts = token.split("_")
    if len(parts) != 3 or parts[0] != PREFIX or len(parts[1]) != 12 or not parts[2]:
        return None
    return parts[1]


class ApiKeyStore:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def create(self, project: str | None, name: str = "", role: Role = "admin") -> tuple[ApiKey, str]:
        """A new key for ``project`` (None: an operator key). Returns it and the token, which is
        not stored and cannot be shown again. A reviewer key belongs to a project."""
        if role not in ROLES:
            raise ValueError(f"role: one of {', '.join(ROLES)}")
        if role == "reviewer" and project is None:
            raise ValueError("role: a reviewer key belongs to a project (--project)")
        key_id = secrets.token_hex(6)
        token = f"{PREFIX}_{key_id}_{secrets.token_urlsafe(32).replace('_', '-')}"
        key = ApiKey(id=key_id, project=project, name=name or ("operator" if project is None else project),
                     created_at=time.time(), role=role)
        record = {**asdict(key), "sha256": _digest(token)}
        if not await self._redis.hsetnx(keys.API_KEYS, key_id, orjson.dumps(record)):
            return await self.create(project, name, role)  # an id collision: 48 random bits, so rare
        return key, token

    async def authenticate(self, token: str) -> ApiKey | None:
        """The active key ``token`` is, or None (unknown, malformed or revoked)."""
        key_id = _parse(token)
        if key_id is None:
            return None
        raw = await self._redis.hget(keys.API_KEYS, key_id)
        if raw is None:
            return None
        record = orjson.loads(raw)
        if not hmac.compare_digest(record.pop("sha256"), _digest(token)):
            return None
        key = ApiKey(**record)
        return key if key.active else None

    async def list(self, project: str | None = None) -> list[ApiKey]:
        """Every key (revoked ones included), or a project's, oldest first."""
        found = []
        for raw in (await self._redis.hgetall(keys.API_KEYS)).values():
            record = orjson.loads(raw)
            record.pop("sha256")
            key = ApiKey(**record)
            if project is None or key.project == project:
                found.append(key)
        return sorted(found, key=lambda k: (k.created_at, k.id))

    async def revoke(self, key_id: str) -> ApiKey:
        """Revoke a key; effective for the next request. Revoking twice keeps the first time."""
        while True:  # another key's creation or revocation between the read and the write: again
            async with self._redis.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(keys.API_KEYS)
                    raw = await pipe.hget(keys.API_KEYS, key_id)
                    if raw is None:
                        raise NotFound(f"no API key with id {key_id!r}")
                    record = orjson.loads(raw)
                    if record.get("revoked_at") is None:
                        record["revoked_at"] = time.time()
                        pipe.multi()  # type: ignore[no-untyped-call]
                        pipe.hset(keys.API_KEYS, key_id, orjson.dumps(record))
                        await pipe.execute()
                except WatchError:
                    continue
            record.pop("sha256")
            return ApiKey(**record)
