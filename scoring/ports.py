"""What the panel needs from the world outside the core, as ports: small Protocols that the
scoring core depends on and ``scoring.members`` implements (the judge client over aiohttp, the
external client over httpx behind the egress guard, the code sandbox). The worker wires the real
ones in; a test may pass any object that fits.

A port that cannot produce a verdict raises ``MemberError`` (a judge or external scorer) or
``CodeScorerError`` (the sandbox), whose text is the reason shown on the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from scoring.errors import ScoringError

if TYPE_CHECKING:
    from scoring.models import CustomEvaluator, Judge
    from scoring.subjects import Subject


class MemberError(ScoringError):
    """A member produced no verdict. ``str(exc)`` is the reason shown on the result."""

    def __init__(self, reason: str, *, retriable: bool = False) -> None:
        super().__init__(reason)
        self.retriable = retriable


class CodeScorerError(ScoringError):
    """Why a code scorer produced no verdict. ``str(exc)`` is a short reason a person reads.

    ``retriable`` is True only for infrastructure failures (a process could not be started, the
    pool is closed); everything the user's code caused - including crashes, which cannot be told
    apart from infrastructure crashes - is not retriable.
    """

    def __init__(self, reason: str, *, retriable: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retriable = retriable


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    rating: float  # native: checked against 0-10 by blend.goodness, never clamped here
    justification: str


class Judges(Protocol):
    """An LLM judge endpoint."""

    async def grade(self, judge: Judge, subject: Subject) -> JudgeVerdict: ...


class ExternalScorers(Protocol):
    """External scorers' HTTP endpoints."""

    async def score(self, scorer: CustomEvaluator, subject: Subject) -> float | bool: ...


class CodeSandbox(Protocol):
    """Where code scorers run: ``run`` one subject, ``run_many`` subjects of one scorer version
    (each entry the value or the CodeScorerError of that subject)."""

    async def run(self, project: str, key: str, code: str, args: dict[str, Any],
                  timeout_s: float) -> float | bool: ...

    async def run_many(self, project: str, key: str, code: str, calls: list[dict[str, Any]],
                       timeout_s: float) -> list[float | bool | CodeScorerError]: ...
