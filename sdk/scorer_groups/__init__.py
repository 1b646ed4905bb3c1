"""The scorer-groups SDK.

    from scorer_groups import Client

    client = Client("http://127.0.0.1:8080", api_key)
    group = client.monitor.scorer_groups.create("Release quality bar", members=[...])
    client.monitor.scorer_groups.update(group.id, online={"enabled": True, "sampleRate": 0.2,
                                                          "alertThreshold": 6, "severity": "high"})
    client.monitor.scorer_groups.ratings(group.id, window="7d")

``AsyncClient`` is the same surface with every call awaited. Results are pydantic models (the
server's own wire models); refusals raise ``ApiError`` subclasses carrying the HTTP status and
the problem body; 429 and 503 are retried with backoff (``Retry``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scorer_groups._async import AsyncBackfill, AsyncClient
    from scorer_groups._calls import Retry
    from scorer_groups._sync import Backfill, Client
    from scorer_groups.agreement import Agreement
    from scorer_groups.api_models import (
        BackfillJob,
        BackfillProgress,
        BudgetView,
        Change,
        Channel,
        Incidents,
        JudgeCallRecord,
        JudgeTemplate,
        Ratings,
        RatingWithCalls,
        ResultsPage,
        RowCalls,
        SessionScore,
    )
    from scorer_groups.documents import Rating
    from scorer_groups.errors import (
        ApiError,
        BadRequest,
        Conflict,
        Forbidden,
        NotFound,
        PreconditionFailed,
        RateLimited,
        ServerError,
        Unauthorized,
    )
    from scorer_groups.evaluations import Evaluation, GateFailed, NotAJudgeMember
    from scorer_groups.models import (
        Budget,
        CustomEvaluator,
        Judge,
        JudgeExample,
        Member,
        OnlineProfile,
        Pattern,
        ScorerGroup,
    )
    from scorer_groups.review_queues import ItemView, LiveAgreement, ReviewItem, ReviewQueue
    from scorer_groups.runs import AgentAnswer

# The names below load on first use (PEP 562): the server imports the wire models
# (scorer_groups.models, ...) without the HTTP clients, so its scoring core loads no httpx.
_HOMES = {
    "AsyncClient": "_async", "Retry": "_calls", "Client": "_sync",
    "AsyncBackfill": "_async", "Backfill": "_sync", "BackfillJob": "api_models", "BackfillProgress": "api_models",
    "ApiError": "errors", "BadRequest": "errors", "Conflict": "errors", "Forbidden": "errors", "NotFound": "errors",
    "PreconditionFailed": "errors", "RateLimited": "errors", "ServerError": "errors", "Unauthorized": "errors",
    "Evaluation": "evaluations", "GateFailed": "gates", "NotAJudgeMember": "gates",
    "Change": "api_models", "Channel": "api_models", "Ratings": "api_models", "SessionScore": "api_models",
    "BudgetView": "api_models", "ResultsPage": "api_models", "Rating": "documents",
    "Budget": "models", "CustomEvaluator": "models", "Judge": "models", "JudgeExample": "models", "Member": "models",
    "OnlineProfile": "models", "Pattern": "models", "ScorerGroup": "models",
    "Agreement": "agreement", "JudgeCallRecord": "api_models", "Incidents": "api_models",
    "JudgeTemplate": "api_models",
    "RatingWithCalls": "api_models", "AgentAnswer": "runs", "RowCalls": "api_models",
    "ReviewQueue": "review_queues", "ReviewItem": "review_queues", "ItemView": "review_queues",
    "LiveAgreement": "review_queues",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'scorer_groups' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"scorer_groups.{home}"), name)
    globals()[name] = value  # once: later reads do not come here
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


__all__ = [
    "AgentAnswer",
    "Agreement",
    "ApiError",
    "AsyncBackfill",
    "AsyncClient",
    "Backfill",
    "BackfillJob",
    "BackfillProgress",
    "BadRequest",
    "Budget",
    "BudgetView",
    "Change",
    "Channel",
    "Client",
    "Conflict",
    "CustomEvaluator",
    "Evaluation",
    "Forbidden",
    "GateFailed",
    "Incidents",
    "ItemView",
    "Judge",
    "JudgeCallRecord",
    "JudgeExample",
    "JudgeTemplate",
    "LiveAgreement",
    "Member",
    "NotAJudgeMember",
    "NotFound",
    "OnlineProfile",
    "Pattern",
    "PreconditionFailed",
    "RateLimited",
    "Rating",
    "RatingWithCalls",
    "Ratings",
    "ResultsPage",
    "Retry",
    "ReviewItem",
    "ReviewQueue",
    "RowCalls",
    "ScorerGroup",
    "ServerError",
    "SessionScore",
    "Unauthorized",
]
