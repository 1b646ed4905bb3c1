"""What the panel needs from the world outside the core, as ports: small Protocols that the
scoring core depends on and ``scoring.members`` implements (the judge client over aiohttp, the
external client over httpx behind the egress guard, the code sandbox). The worker wires the real
ones in; a test may pass any object that fits.

A port that cannot produce a verdict raises ``MemberError`` (a judge or external scorer) or
``CodeScorerError`` (the sandbox), whose text is the reason shown on the result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
    usage: TokenUsage | None = None  # what the call cost, when the API said (OpenAI's ``usage``)


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Tokens one judge call cost, as the API reported them (either may be missing), and what
    they cost in money (``scoring.prices``: None when unknown - an unpriced model - never 0)."""

    prompt_tokens: int | None
    completion_tokens: int | None
    cost: float | None = None

    @property
    def total(self) -> int:
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)


@dataclass(frozen=True, slots=True)
class JudgeCall:
    """One judge call as it was made: what the judge was asked and what it answered. The client
    records it whatever the outcome (an error, a refusal, the member's deadline); the panel cuts
    and masks it before it is kept (``scoring.judge_calls``)."""

    model: str
    messages: tuple[tuple[str, str], ...]  # (role, content), as sent
    answer: str | None  # the answer's text (a chat completion's content, else its raw body); None: no answer
    started_at: float  # epoch seconds
    latency_s: float
    attempts: int  # HTTP requests sent: retries and reshapes included
    usage: TokenUsage | None
    error: str | None = None
    lengths: tuple[int, ...] = ()  # once cut: each message's full length, then the answer's
    # Not made: the verdict was paid for already (``scoring.verdict_cache``), by this rating's call.
    cached_from: str | None = None


# Told of each judge call once it ended, whatever its outcome.
CallRecorder = Callable[[JudgeCall], None]


# Asked before each retry of a judge call: True when one more slot of the budget was reserved
# for it (a retry is a call, and the budget counts calls made); False refuses the retry.
RetryGate = Callable[[], Awaitable[bool]]


class Judges(Protocol):
    """An LLM judge endpoint."""

    async def grade(self, judge: Judge, subject: Subject, *, retry: RetryGate | None = None,
                    record: CallRecorder | None = None, messages: list[dict[str, str]] | None = None) -> JudgeVerdict:
        """``messages``: ``judge_prompt.build_messages(judge, subject)`` when the caller built them."""
        ...

    def model_for(self, judge: Judge) -> str:
        """The model a call of ``judge`` names (its own, else the endpoint's default)."""
        ...

    def signature(self, judge: Judge) -> str:
        """Everything a call of ``judge`` sends but its messages - the endpoint, the model, the
        request's shape: with the messages, what makes two calls the same call."""
        ...


class BudgetExhausted(ScoringError):
    """The judge budget had no room for a gates-first group's judges once its cheap gates passed:
    the group is skipped whole, as when its claim finds the budget exhausted."""

    retriable = True


class JudgeSpend(Protocol):
    """The judge-call budget of the pair being scored, for the calls decided while it is scored
    (``adapters.stores.claims``): a live pair's, the playground's, a dataset run row's."""

    # Under a token budget, each reservation also takes the calls' token ceiling
    # (``scoring.judge_prompt.token_ceiling``); without one, tokens are only counted, never asked.
    counts_tokens: bool

    async def reserve_panel(self, calls: int, tokens: int) -> bool:
        """A gates-first group's judge calls, all or nothing, once its cheap gates passed."""
        ...

    async def reserve_retry(self, tokens: int) -> bool:
        """One more slot, before a judge call is retried."""
        ...


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
