"""Judge call records: what each judge was asked and answered, kept with the group's results.

1. The judge client records every call whatever its outcome (``scoring.ports.JudgeCall``).
2. The panel keeps it cut and masked (``kept``): each message and the answer cut at
   ``CALL_TEXT_MAX_CHARS`` with their full lengths said, then cut of secrets by the same redactor
   as every published reason - a trace may carry a key, and a judge may echo it.
3. The outputs encode a result's calls (``encode_calls``) beside its rating; the ratings store
   keeps them as long as the rating stays among the group's latest results
   (``scoring.stores.ratings``), and ``GET /v1/scorer-groups/{id}/results/{ratingId}`` answers
   them (the wire model is ``scorer_groups.api_models.JudgeCallRecord``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson

from scoring.ports import JudgeCall

# Bounds what one call keeps in Redis: a judge prompt carries the trace's input and output (up to
# 40,000 characters each, scoring.judge_prompt); a person reading why a judge said 3 needs its
# question's head and the answer, not a megabyte per result. 1,000 results x a few calls each.
CALL_TEXT_MAX_CHARS = 4_000
# Redacted past the cut by this much, then cut again: a secret that straddles the cut is
# masked whole before the cut, never left as a prefix the redactor cannot recognise.
_REDACT_MARGIN = 256


def kept(call: JudgeCall, redact: Callable[[str], str], max_chars: int = CALL_TEXT_MAX_CHARS) -> JudgeCall:
    """The call as it may be kept and shown: texts cut at ``max_chars`` (their full lengths
    said in ``lengths``) and cut of secrets."""
    def cut(text: str) -> str:
        text = redact(text) if len(text) <= max_chars else redact(text[:max_chars + _REDACT_MARGIN])[:max_chars]
        # Text UTF-8 cannot carry (a lone surrogate a judge's JSON answer may hold) is replaced.
        return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")

    messages = tuple((role, cut(content)) for role, content in call.messages)
    lengths = (*(len(content) for _, content in call.messages), len(call.answer or ""))
    return replace(call, messages=messages, answer=None if call.answer is None else cut(call.answer),
                   error=None if call.error is None else redact(call.error), lengths=lengths)


def call_document(call: JudgeCall, ref_id: str, member: str) -> dict[str, Any]:
    """One kept call in the wire's shape (``JudgeCallRecord``)."""
    lengths = call.lengths or (*(len(c) for _, c in call.messages), len(call.answer or ""))
    return {
        "refId": ref_id, "member": member, "model": call.model,
        "messages": [{"role": role, "content": content, "length": length}
                     for (role, content), length in zip(call.messages, lengths, strict=False)],
        "answer": call.answer, "answerLength": lengths[-1],
        "startedAt": datetime.fromtimestamp(call.started_at, UTC), "latencyMs": round(call.latency_s * 1000, 3),
        "attempts": call.attempts,
        "usage": None if call.usage is None else {"promptTokens": call.usage.prompt_tokens,
                                                  "completionTokens": call.usage.completion_tokens},
        "error": call.error}


def encode_calls(members: list[tuple[str, str, tuple[JudgeCall, ...]]]) -> bytes:
    """A result's judge calls as kept with it: (ref id, member label, its calls) per member; b""
    when no member made one (nothing is kept for it)."""
    documents = [call_document(call, ref_id, member) for ref_id, member, calls in members for call in calls]
    if not documents:
        return b""
    return orjson.dumps(documents, option=orjson.OPT_UTC_Z)
