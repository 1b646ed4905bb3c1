"""Sweeping a project of the test's own with the real session sweeper, Redis and broker.

Every test sweeps its own project (``Sweep.project``) in the shared database 0, so tests never
see each other's sessions, claims or index - in any order, and in parallel runs too."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from adapters.stores import keys
from adapters.stores.claims import Claims
from adapters.stores.ratings import RatingsStore
from adapters.stores.sessions import SessionStore
from consumers.events import PipelineEvents, Silent
from consumers.outputs import Outputs, TopicNames
from consumers.sessions import SessionSweeper
from scoring.catalog import CatalogSnapshot
from scoring.claim_request import ClaimRequest, day_of
from scoring.models import Pattern, ScorerGroup
from scoring.panel import Panel
from scoring.subjects import Trace
from tests.support.harness import read_topic

APOLOGY = Pattern(id="apology", name="Apology", polarity="failure", template="apology")


def session_group(project: str, group_id: str = "conv", idle: int = 0, rate: float = 1.0, enabled: bool = True,
                  members: list[dict[str, Any]] | None = None, salt: str | None = None) -> ScorerGroup:
    """A live session-scope group; by default one apology pattern, which a turn saying "fine" passes."""
    return ScorerGroup.model_validate({
        "id": group_id, "name": group_id, "projectId": project,
        "online": {"enabled": enabled, "sampleRate": rate, "alertThreshold": None, "severity": "low",
                   "scope": "session", "idleSeconds": idle, **({"sampleSalt": salt} if salt else {})},
        "members": members or [{"kind": "pattern", "refId": "apology", "weight": 1, "gate": False}]})


def turn(project: str, session: str, n: int, timestamp: str | None = None) -> Trace:
    return Trace.model_validate({"traceId": f"{session}-{n}", "projectId": project, "agentId": "a",
                                 "sessionId": session, "timestamp": timestamp or f"2026-12-02T13:00:{n:02d}Z",
                                 "spans": [{"spanId": "r", "input": "q", "output": "fine"}]})


@dataclass
class Sweep:
    """A project of the test's own on the real Redis and broker, and sweepers over it."""

    redis: Redis
    producer: AIOKafkaProducer
    bootstrap: str
    topics: TopicNames
    project: str
    store: SessionStore

    def catalog(self, *groups: ScorerGroup, **more: Any) -> CatalogSnapshot:
        """The groups (by default one: ``session_group(project)``) with the apology pattern."""
        groups = groups or (session_group(self.project),)
        return CatalogSnapshot(version=1, groups={g.id: g for g in groups},
                               patterns={"apology": APOLOGY, **more.pop("patterns", {})}, **more)

    def sweeper(self, catalog: CatalogSnapshot | Callable[[], CatalogSnapshot], *, store: SessionStore | None = None,
                claims: Claims | None = None, panel: Panel | None = None, events: PipelineEvents | None = None,
                **kw: Any) -> SessionSweeper:
        return SessionSweeper(store=store or self.store, outputs=Outputs(self.producer, self.topics, Silent()),
                              catalog=catalog if callable(catalog) else lambda: catalog, panel=panel or Panel(),
                              claims=claims or Claims(self.redis, lease_s=1.0), ratings=RatingsStore(self.redis),
                              events=events, **kw)

    async def add_turns(self, session: str, turns: int, at: float, project: str | None = None) -> None:
        """``turns`` turns of ``session``, its last activity at ``at``."""
        project = project or self.project
        await self.store.add_turns([turn(project, session, n) for n in range(1, turns + 1)], now=at)

    async def index(self, project: str | None = None) -> set[str]:
        """The sessions the sweep still watches."""
        members = await self.redis.zrange(keys.session_activity(project or self.project), 0, -1)
        return {m.decode() for m in members}

    async def published(self, count: int, settle_s: float = 0.5) -> list[dict[str, Any]]:
        """The ratings published, once there are ``count`` (and ``settle_s`` more for any extra)."""
        return await read_topic(self.bootstrap, self.topics.ratings, until=lambda v: len(v) >= count,
                                settle_s=settle_s)

    async def ratings(self, count: int, settle_s: float = 0.5) -> list[tuple[str, str, int]]:
        """(group, session, turns) of each rating published, sorted."""
        return sorted((r["groupId"], r["sessionId"], r["turns"]) for r in await self.published(count, settle_s))

    def claim(self, session: str, turns: int, group: str = "conv") -> ClaimRequest:
        """The claim a sweep makes for a session ``record`` stored (its turns are dated that day)."""
        first = turn(self.project, session, 1).timestamp.timestamp()
        return ClaimRequest(self.project, group, f"session:{session}:{turns}", 0, None, day=day_of(first))


@contextlib.asynccontextmanager
async def project_sweep(redis: Redis, kafka_bootstrap: str, unique: str) -> AsyncIterator[Sweep]:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    topics = TopicNames(traces="-", ratings=f"sw-ratings-{unique}", signals=f"sw-signals-{unique}",
                        webhooks=f"sw-webhooks-{unique}", dlq="-")
    try:
        yield Sweep(redis, producer, kafka_bootstrap, topics, f"p-sw-{unique}", SessionStore(redis))
    finally:
        await producer.stop()
