"""The change log: every catalog write, per document - who made it, when, and what changed.

``CatalogStore.write`` asks ``entry`` for one line per document it writes and pushes it in the
same transaction as the change, so a change is never stored without its record (or the record
without the change). Values are shown as people may see them: secrets masked.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from adapters.stores import keys
from adapters.stores.client import RedisClient
from scoring.models import WireModel


def entry(actor: str, before: WireModel | None, after: WireModel | None, at: float | None = None) -> bytes:
    """One change-log line: the action, and each top-level field that changed (before, after)."""
    old: dict[str, Any] = before.wire() if before is not None else {}
    new: dict[str, Any] = after.wire() if after is not None else {}
    action = "created" if before is None else "deleted" if after is None else "updated"
    changed = {name: {"before": old.get(name), "after": new.get(name)}
               for name in sorted(set(old) | set(new)) if old.get(name) != new.get(name)}
    if before is not None and after is not None and before.stored() != after.stored() and not changed:
        changed = {"secret": {"before": "**********", "after": "**********"}}  # only a secret changed
    owner = getattr(after if after is not None else before, "project_id", None)
    return orjson.dumps({"at": time.time() if at is None else at, "actor": actor, "action": action,
                         "projectId": owner, "changes": changed})


class ChangeLog:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def read(self, kind: str, doc_id: str, offset: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """Entries of one document, newest first (it may be deleted since)."""
        raw = await self._redis.lrange(keys.catalog_changes(kind, doc_id), offset, offset + limit - 1)
        return [orjson.loads(line) for line in raw]

    async def owner(self, kind: str, doc_id: str) -> str | None:
        """The project the document last belonged to, by its newest entry (None if unknown)."""
        newest = await self.read(kind, doc_id, 0, 1)
        return newest[0].get("projectId") if newest else None
