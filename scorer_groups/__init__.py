"""The scorer-groups SDK, as the spec shows it.

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

from scorer_groups._async import AsyncClient
from scorer_groups._calls import Retry
from scorer_groups._sync import Client
from scorer_groups.errors import (
    ApiError,
    BadRequest,
    Forbidden,
    NotFound,
    PreconditionFailed,
    RateLimited,
    ServerError,
    Unauthorized,
)
from scorer_groups.evaluations import Evaluation, GateFailed, NotAJudgeMember
from scoring.api_models import Change, Channel, Ratings, SessionScore
from scoring.models import Budget, CustomEvaluator, Judge, Member, OnlineProfile, Pattern, ScorerGroup

__all__ = [
    "ApiError",
    "AsyncClient",
    "BadRequest",
    "Budget",
    "Change",
    "Channel",
    "Client",
    "CustomEvaluator",
    "Evaluation",
    "Forbidden",
    "GateFailed",
    "Judge",
    "Member",
    "NotAJudgeMember",
    "NotFound",
    "OnlineProfile",
    "Pattern",
    "PreconditionFailed",
    "RateLimited",
    "Ratings",
    "Retry",
    "ScorerGroup",
    "ServerError",
    "SessionScore",
    "Unauthorized",
]
