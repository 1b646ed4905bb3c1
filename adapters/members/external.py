"""External scorer members: an HTTP service that grades ``{input, output, expected, spans,
metadata}`` and answers ``{"score": 0..1}`` or a boolean verdict (``{"verdict": true}`` or
``{"passed": true}``), which ``blend.goodness`` maps through the scorer's ``invert``.

The URL is the user's: it passes the private-network guard before every call, and redirects
are not followed (a redirect is a second URL that was never checked).
"""

from __future__ import annotations

import asyncio

import httpx

from adapters.egress import EgressPolicy, EgressRefused
from adapters.members.http import DEFAULT_RETRY, RetryPolicy, no_cookies, post_json
from scoring.members.fair_share import FairShare
from scoring.models import CustomEvaluator
from scoring.ports import MemberError
from scoring.subjects import Subject

VERDICT_KEYS = ("verdict", "passed")


def read_answer(document: object) -> float | bool:
    """The native verdict in an external scorer's answer; MemberError when there is none."""
    if not isinstance(document, dict):
        raise MemberError(f"external scorer answered {type(document).__name__}, expected a JSON object")
    score = document.get("score")
    if score is not None:
        if isinstance(score, bool) or not isinstance(score, int | float):
            raise MemberError(f"external scorer's score is not a number (score={score!r})")
        return float(score)
    for key in VERDICT_KEYS:
        verdict = document.get(key)
        if isinstance(verdict, bool):
            return verdict
    raise MemberError('external scorer answered neither "score" nor a boolean "verdict"/"passed"')


class ExternalClient:
    """Calls external scorers over one pooled HTTP client, its connections shared fairly across
    projects (``scoring.members.fair_share``): one project's slow scorer cannot hold them all."""

    def __init__(self, egress: EgressPolicy, *, policy: RetryPolicy = DEFAULT_RETRY,
                 max_connections: int = 64, per_project: int | None = None) -> None:
        self._egress = egress
        self._policy = policy
        self._connections = FairShare(max_connections, per_project)
        self._http = httpx.AsyncClient(
            follow_redirects=False,
            limits=httpx.Limits(max_connections=max_connections),
            headers={"User-Agent": "scorer-group-worker"},
            cookies=no_cookies(),
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def score(self, scorer: CustomEvaluator, subject: Subject) -> float | bool:
        assert scorer.url is not None  # the model guarantees it for type "external"
        deadline = asyncio.get_running_loop().time() + scorer.timeout_ms / 1000
        try:
            target = await self._egress.check(scorer.url)
        except EgressRefused as exc:
            raise MemberError(f"external scorer URL refused: {exc}", retriable=exc.retriable) from None
        async with self._connections.slot(subject.project_id):
            response = await post_json(self._http, target.url, subject.member_payload(), what="external scorer",
                                       deadline=deadline, headers=target.headers, extensions=target.extensions,
                                       policy=self._policy)
        try:
            document = response.json()
        except ValueError:
            raise MemberError(f"external scorer answer is not JSON: {response.text[:120]!r}") from None
        return read_answer(document)
