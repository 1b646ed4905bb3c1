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
from collections.abc import Callable
from typing import Any

import aiohttp

from scoring.judge_prompt import ANSWER_MAX_TOKENS, build_messages, parse_verdict
from scoring.members.fair_share import FairShare
from scoring.members.http import DEFAULT_RETRY, Answer, RetryPolicy, post_json_aiohttp
from scoring.models import Judge
from scoring.ports import JudgeVerdict, MemberError, RetryGate, TokenUsage
from scoring.subjects import Subject


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
    ) -> None:
        self._observe = observe  # (outcome "ok" | "error", seconds) per judge call, for metrics
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
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
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._concurrency, ssl=ssl.create_default_context()),
                headers={"User-Agent": "scorer-group-worker"})
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def grade(self, judge: Judge, subject: Subject, *, retry: RetryGate | None = None) -> JudgeVerdict:
        if judge.requires_expected and subject.expected is None:
            raise MemberError("judge requires an expected answer and this subject has none")
        body = {
            "model": judge.model or self._model,
            "messages": build_messages(judge, subject),
            "temperature": 0,
            "max_tokens": ANSWER_MAX_TOKENS,  # bounds the call's cost, and the ceiling a token budget reserves
            "response_format": {"type": "json_object"},
        }
        started = time.perf_counter()
        outcome = "error"
        try:
            async with self._slots.slot(subject.project_id):
                deadline = asyncio.get_running_loop().time() + self._timeout_s
                response = await post_json_aiohttp(self._http(), self._url, body, what="judge",
                                                   deadline=deadline, headers=self._headers, policy=self._policy,
                                                   before_retry=retry)
            try:
                document = response.json()
            except ValueError:
                document = None
            verdict = parse_verdict(_content(document, response))
            outcome = "ok"
            return JudgeVerdict(verdict.rating, verdict.justification, usage_of(document))
        finally:
            if self._observe is not None:
                self._observe(outcome, time.perf_counter() - started)


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


def _content(document: Any, response: Answer) -> str:
    try:
        content = document["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise MemberError(f"judge answer is not a chat completion: {response.text[:120]!r}") from None
    if not isinstance(content, str):
        raise MemberError("judge answer has no text content")
    return content

