"""The scoring engine: the panel with the clients its members call - the judge endpoint, external
scorers behind the egress guard, the code-scorer sandbox - and the redactor that cuts the
process's secrets from what members say.

Built from ``Settings`` once per process: by the worker, by ``scorer-worker grade``, and by the
HTTP API in its lifespan. So every grading in a process shares one judge concurrency cap, one
sandbox pool and one pool of external-scorer connections, each shared fairly across projects
(``scoring.members.fair_share``), and API grading is bounded like the worker's, not given a pool
per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from adapters.egress import EgressPolicy
from adapters.members.external import ExternalClient
from adapters.members.judge import JudgeClient, RequestShape
from adapters.members.sandbox import SandboxPool
from scoring.panel import MemberObserver, Panel, TokenObserver
from scoring.redact import Redactor
from scoring.verdict_cache import CachePolicy
from worker.settings import Settings


def sandbox_pool(settings: Settings) -> SandboxPool:
    """The code-scorer sandbox as the settings describe it (confined unless explicitly unsafe)."""
    return SandboxPool(size=settings.code_sandboxes, memory_limit_mb=settings.code_memory_mb,
                       per_project=settings.code_sandboxes_per_project or None,
                       isolation=settings.code_sandbox, python=settings.sandbox_python,
                       sandbox_uid=settings.sandbox_uid)


def judge_client(settings: Settings, observe: Callable[[str, float], None] | None = None) -> JudgeClient:
    """The judge endpoint as the settings describe it (its address, key, model, headers, the
    shape of a call, the concurrency shared fairly across projects)."""
    return JudgeClient(settings.judge_base_url, api_key=settings.judge_api_key.get_secret_value(),
                       model=settings.judge_model, timeout_s=settings.judge_timeout_s,
                       concurrency=settings.judge_concurrency,
                       per_project=settings.judge_concurrency_per_project or None,
                       observe=observe, extra_headers=settings.judge_headers(),
                       shape=RequestShape(settings.judge_token_limit_param, settings.judge_response_format),
                       prices=settings.prices())


def redactor(settings: Settings) -> Redactor:
    """Cuts the process's secrets from whatever members publish."""
    return Redactor.from_environment(settings.secrets())


class ScoringEngine:
    """``start`` warms the sandbox (it never raises: code scorers fail closed and say why);
    ``close`` ends every client. Also an async context manager doing both."""

    def __init__(self, settings: Settings, *, observe_judge_call: Callable[[str, float], None] | None = None,
                 observe_member: MemberObserver | None = None, count_tokens: TokenObserver | None = None) -> None:
        self.judges = judge_client(settings, observe_judge_call)
        self.external = ExternalClient(EgressPolicy.parse(settings.egress_allow_list()),
                                       max_connections=settings.external_connections,
                                       per_project=settings.external_connections_per_project or None)
        self.sandbox = sandbox_pool(settings)
        self.panel = Panel(judges=self.judges, external=self.external, sandbox=self.sandbox,
                           member_deadline_s=settings.member_deadline_s, observe=observe_member,
                           redact=redactor(settings), count_tokens=count_tokens,
                           verdict_cache=CachePolicy(settings.judge_cache_ttl_s, settings.judge_cache_max_entries)
                           if settings.judge_cache_ttl_s > 0 else None,
                           pricing=settings.pricing())

    async def start(self) -> ScoringEngine:
        await self.sandbox.start()
        return self

    async def close(self) -> None:
        results = await asyncio.gather(self.sandbox.close(), self.judges.close(), self.external.close(),
                                       return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]

    async def __aenter__(self) -> ScoringEngine:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()
