"""LLM judge members: a rubric verdict (0-10) from an OpenAI-compatible chat-completions API.

Only the rubric verdict counts inside a group: a judge's similarity metrics and attached code
checks belong to that scorer's own grading recipe and never run here.

Trace scope asks about one response, with the judge's own ``judgePrompt``. Session scope asks
the structured whole-session question built from the criteria (consistency across turns,
whether the user's need was resolved) and never uses ``judgePrompt``.
"""

from __future__ import annotations

import asyncio
import collections
import re
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from scoring.members.http import DEFAULT_RETRY, MemberError, RetryPolicy, post_json
from scoring.models import Judge
from scoring.subjects import Subject, as_text

# Bounds what one judge call can cost: text beyond this is cut, with a marker saying so.
MAX_TEXT_CHARS = 40_000

SYSTEM_PROMPT = (
    "You are an impartial evaluator of an AI agent's work. Grade strictly against the criteria "
    "on a 0-10 scale, where 10 fully meets them and 0 fails them completely. Answer with one JSON "
    'object and nothing else: {"rating": <number from 0 to 10>, "justification": "<one or two '
    'sentences>"}.'
)

SESSION_QUESTION = (
    "Judge the whole conversation below as one unit against these criteria:\n{criteria}\n\n"
    "Consider in particular:\n"
    "1. Consistency across turns: does the agent contradict, forget or undo what it said or "
    "learned in earlier turns?\n"
    "2. Resolution: by the end, was the user's need resolved?\n\n"
    "Conversation ({turns} turns):\n{transcript}"
)


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    rating: float  # native: checked against 0-10 by blend.goodness, never clamped here
    justification: str


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] + f"\n[... {len(text) - MAX_TEXT_CHARS} more characters cut]"


def build_messages(judge: Judge, subject: Subject) -> list[dict[str, str]]:
    """The chat messages that ask ``judge`` about ``subject``."""
    if subject.scope == "session":
        question = SESSION_QUESTION.format(criteria=judge.criteria, turns=subject.turns,
                                           transcript=_cut(subject.transcript))
    else:
        parts = [f"Criteria:\n{judge.criteria}"]
        if judge.judge_prompt:
            parts.append(judge.judge_prompt)
        parts.append(f"Input:\n{_cut(subject.input)}")
        parts.append(f"Response:\n{_cut(subject.output)}")
        if subject.expected is not None:
            parts.append(f"Expected answer:\n{_cut(as_text(subject.expected))}")
        question = "\n\n".join(parts)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$", re.IGNORECASE)


def parse_verdict(content: str) -> JudgeVerdict:
    """Read ``{rating, justification}`` from a model's answer, tolerating code fences and
    prose around the object. Raises MemberError saying what was wrong."""
    text = _FENCE.sub("", content.strip())
    document: Any = None
    for candidate in (text, text[text.find("{"): text.rfind("}") + 1]):
        try:
            document = orjson.loads(candidate)
            break
        except orjson.JSONDecodeError:
            continue
    if not isinstance(document, dict):
        raise MemberError(f"judge answer is not a JSON object: {content[:120]!r}")
    rating = document.get("rating")
    if isinstance(rating, str):
        try:
            rating = float(rating.strip())
        except ValueError:
            pass
    if isinstance(rating, bool) or not isinstance(rating, int | float):
        raise MemberError(f"judge answer has no numeric rating (rating={rating!r})")
    justification = document.get("justification")
    return JudgeVerdict(float(rating), justification if isinstance(justification, str) else "")


class JudgeClient:
    """One OpenAI-compatible endpoint: pooled connections and a cap on concurrent calls."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "",
        model: str = "gpt-4o-mini",
        timeout_s: float = 30.0,
        concurrency: int = 16,
        policy: RetryPolicy = DEFAULT_RETRY,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self._observe = observe  # (outcome "ok" | "error", seconds) per judge call, for metrics
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._model = model
        self._timeout_s = timeout_s
        self._policy = policy
        self._slots = asyncio.Semaphore(concurrency)
        # One connection per client, as many clients as calls may run, and a call takes an idle
        # one: httpx's pool looks over all of its connections (and polls each idle socket) for
        # every request, which cost more than the calls themselves past a few connections
        # (measured at 256 concurrent calls: 0.28 of concurrency / latency with pools of 16,
        # 0.66 with pools of 4). One TLS context serves them all.
        tls = ssl.create_default_context()
        self._clients = [httpx.AsyncClient(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
                                           timeout=timeout_s, verify=tls) for _ in range(concurrency)]
        self._idle = collections.deque(self._clients)  # never empty while a slot is held

    async def close(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def grade(self, judge: Judge, subject: Subject) -> JudgeVerdict:
        if judge.requires_expected and subject.expected is None:
            raise MemberError("judge requires an expected answer and this subject has none")
        body = {
            "model": judge.model or self._model,
            "messages": build_messages(judge, subject),
            "temperature": 0,
            "response_format": {"type": "json_object"},
        }
        started = time.perf_counter()
        outcome = "error"
        try:
            async with self._slots:
                client = self._idle.popleft()
                try:
                    deadline = asyncio.get_running_loop().time() + self._timeout_s
                    response = await post_json(client, self._url, body, what="judge", deadline=deadline,
                                               headers=self._headers, policy=self._policy)
                finally:
                    self._idle.append(client)
            verdict = parse_verdict(_content(response))
            outcome = "ok"
            return verdict
        finally:
            if self._observe is not None:
                self._observe(outcome, time.perf_counter() - started)


def _content(response: httpx.Response) -> str:
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise MemberError(f"judge answer is not a chat completion: {response.text[:120]!r}") from None
    if not isinstance(content, str):
        raise MemberError("judge answer has no text content")
    return content

