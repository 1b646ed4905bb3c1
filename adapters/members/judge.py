"""LLM judge members: a rubric verdict (0-10) from an OpenAI-compatible chat-completions API.

Only the rubric verdict counts inside a group: a judge's similarity metrics and attached code
checks belong to that scorer's own grading recipe and never run here.

What a judge is asked and how its answer is read are ``scoring.judge_prompt`` (pure); this is
the client that sends it.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import aiohttp
import orjson
import structlog

from adapters.members.http import DEFAULT_RETRY, Answer, RetryPolicy, post_json_aiohttp
from scoring.judge_prompt import ANSWER_MAX_TOKENS, build_messages, parse_verdict
from scoring.members.fair_share import FairShare
from scoring.models import Judge
from scoring.ports import CallRecorder, JudgeCall, JudgeVerdict, MemberError, RetryGate, TokenUsage
from scoring.prices import Price, priced
from scoring.subjects import Subject

log = structlog.get_logger(__name__)


class JudgeClient:
    """One OpenAI-compatible endpoint: pooled connections and a cap on concurrent calls, shared
    fairly across projects (``scoring.members.fair_share``)."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "",
        model: str = "gpt-4o-mini",
        timeout_s: float = 30.0,
        concurrency: int = 16,
        per_project: int | None = None,
        policy: RetryPolicy = DEFAULT_RETRY,
        observe: Callable[[str, float], None] | None = None,
        shape: RequestShape | None = None,
        extra_headers: dict[str, str] | None = None,
        prices: Mapping[str, Price] | None = None,
    ) -> None:
        self._prices = prices or {}  # per model (scoring.prices): a call's usage carries its cost
        self._observe = observe  # (outcome "ok" | "error", seconds) per judge call, for metrics
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {**(extra_headers or {}), **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self._shape = shape or RequestShape()
        self._learned: dict[str, RequestShape] = {}  # by model: what its refusals taught
        self._model = model
        self._timeout_s = timeout_s
        self._policy = policy
        self._slots = FairShare(concurrency, per_project)  # shared fairly across projects
        # aiohttp rather than httpx for the judge: one operator's endpoint, hundreds of calls at
        # once, and httpx spent 1.0 ms of CPU per call where aiohttp spends 0.28 (measured at 256
        # concurrent calls) - at that rate httpx alone could not keep 256 calls in flight. The
        # session is made on first use: it belongs to the running event loop.
        self._concurrency = concurrency
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            # No cookie jar: a cookie the endpoint sets while answering one tenant's call must not
            # ride along with another's (and the default jar's filtering is ~10% of a call's CPU).
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._concurrency, ssl=ssl.create_default_context()),
                headers={"User-Agent": "scorer-group-worker"}, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def model_for(self, judge: Judge) -> str:
        return judge.model or self._model

    def signature(self, judge: Judge) -> str:
        model = self.model_for(judge)
        return orjson.dumps([self._url, self.shape_for(model).body(model, [])]).decode()

    def shape_for(self, model: str) -> RequestShape:
        """What the endpoint takes for ``model``: the settings', or what its refusals taught."""
        return self._learned.get(model, self._shape)

    async def grade(self, judge: Judge, subject: Subject, *, retry: RetryGate | None = None,
                    record: CallRecorder | None = None, messages: list[dict[str, str]] | None = None) -> JudgeVerdict:
        if judge.requires_expected and subject.expected is None:
            raise MemberError("judge requires an expected answer and this subject has none")
        model = self.model_for(judge)
        messages = messages or build_messages(judge, subject)
        started, started_at = time.perf_counter(), time.time()
        call = _CallUnderWay()
        outcome = "error"
        try:
            async with self._slots.slot(subject.project_id):
                deadline = asyncio.get_running_loop().time() + self._timeout_s
                response = await self._post(model, messages, deadline, retry, call)
            try:
                document = response.json()
            except ValueError:
                document = None
            call.usage = priced(self._prices, model, usage_of(document))
            content = _message_content(document)
            call.answer = content if isinstance(content, str) else response.text  # the record keeps what came
            if not isinstance(content, str):
                raise MemberError(f"judge answer is not a chat completion: {response.text[:120]!r}"
                                  if content is _NOT_A_COMPLETION else "judge answer has no text content")
            verdict = parse_verdict(content)
            outcome = "ok"
            return JudgeVerdict(verdict.rating, verdict.justification, call.usage)
        except MemberError as exc:
            call.error = str(exc)
            raise
        except (asyncio.CancelledError, TimeoutError):  # the member's deadline, or a shutdown
            call.error = "cancelled before the judge answered" if call.answer is None else "cancelled"
            raise
        finally:
            elapsed = time.perf_counter() - started
            if self._observe is not None:
                self._observe(outcome, elapsed)
            if record is not None:  # the record of the call, whatever its outcome
                record(JudgeCall(model, tuple((m["role"], m["content"]) for m in messages), call.answer,
                                 started_at, elapsed, call.attempts, call.usage, call.error))

    async def _post(self, model: str, messages: list[dict[str, str]], deadline: float,
                    retry: RetryGate | None, call: _CallUnderWay) -> Answer:
        """The call, in the shape the endpoint takes: a 400 that refuses a parameter we sent
        (``max_tokens`` on OpenAI's reasoning models, ``response_format`` on some gateways) is
        learned for the model and the call made again without it - a retry like any other, so it
        reserves one more call from the budget first."""
        for _ in range(MAX_RESHAPES + 1):
            shape = self.shape_for(model)
            try:
                return await post_json_aiohttp(self._http(), self._url, shape.body(model, messages), what="judge",
                                               deadline=deadline, headers=self._headers, policy=self._policy,
                                               before_retry=retry, sent=call.sent)
            except MemberError as exc:
                better = shape.without_refused(str(exc))
                if better is None:
                    raise
                if len(self._learned) >= MAX_LEARNED_MODELS:  # models are tenants' strings: bounded
                    self._learned.clear()
                self._learned[model] = better
                log.warning("the judge endpoint refused a parameter; calls for this model now go without it",
                            model=model, refused=str(exc)[:200], now=better.described())
                if retry is not None and not await retry():
                    raise MemberError(f"{exc}; budget exhausted before the call without the refused parameter",
                                      retriable=False) from None
        raise MemberError("judge refused every shape of the call", retriable=False)


class _CallUnderWay:
    """What a judge call has gathered so far, for its record (``JudgeCall``)."""

    __slots__ = ("answer", "attempts", "error", "usage")

    def __init__(self) -> None:
        self.attempts = 0
        self.answer: str | None = None
        self.usage: TokenUsage | None = None
        self.error: str | None = None

    def sent(self) -> None:
        self.attempts += 1


MAX_LEARNED_MODELS = 256
MAX_RESHAPES = 3  # max_tokens -> max_completion_tokens -> none, and response_format dropped
# How endpoints say a parameter is not taken at all (OpenAI, Azure, gateways, pydantic-based
# servers) - unlike a value out of range ("'max_tokens' ... is too large"), which is no refusal.
REFUSED_WORDS = ("unsupported", "not supported", "unrecognized", "unknown parameter", "extra inputs are not permitted",
                 "extra_forbidden", "not allowed")


@dataclass(frozen=True)
class RequestShape:
    """The parameters a chat-completions endpoint takes beside the messages. ``token_limit``:
    which parameter bounds the answer (``max_tokens``; ``max_completion_tokens`` for OpenAI's
    reasoning models; ``none`` - then a token budget settles to the usage reported);
    ``response_format``: whether to ask for a JSON object."""

    token_limit: Literal["max_tokens", "max_completion_tokens", "none"] = "max_tokens"
    response_format: bool = True

    def body(self, model: str, messages: list[dict[str, str]]) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": messages, "temperature": 0}
        if self.token_limit != "none":
            body[self.token_limit] = ANSWER_MAX_TOKENS  # bounds the call's cost; a token budget reserves it
        if self.response_format:
            body["response_format"] = {"type": "json_object"}
        return body

    def without_refused(self, error: str) -> RequestShape | None:
        """The shape to try after ``error``, if it is a 400 refusing a parameter we sent."""
        lowered = error.lower()
        if "HTTP 400" not in error or "too large" in lowered or not any(w in lowered for w in REFUSED_WORDS):
            return None
        if self.token_limit == "max_tokens" and "max_tokens" in error:
            return replace(self, token_limit="max_completion_tokens" if "max_completion_tokens" in error else "none")
        if self.token_limit == "max_completion_tokens" and "max_completion_tokens" in error:
            return replace(self, token_limit="none")
        if self.response_format and "response_format" in error:
            return replace(self, response_format=False)
        return None

    def described(self) -> str:
        return f"{self.token_limit}, response_format {'json_object' if self.response_format else 'not sent'}"


def usage_of(document: Any) -> TokenUsage | None:
    """A chat completion's ``usage`` (prompt and completion tokens), or None when the API sent
    none. A count that is not a whole number of 0 or more is left out rather than trusted."""
    usage = document.get("usage") if isinstance(document, dict) else None
    if not isinstance(usage, dict):
        return None

    def count(name: str) -> int | None:
        value = usage.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53 else None

    prompt, completion = count("prompt_tokens"), count("completion_tokens")
    return None if prompt is None and completion is None else TokenUsage(prompt, completion)


_NOT_A_COMPLETION = object()


def _message_content(document: Any) -> Any:
    """A chat completion's message content (text when the judge answered one), or
    ``_NOT_A_COMPLETION`` when the answer is not a chat completion at all."""
    try:
        return document["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return _NOT_A_COMPLETION
