"""Judge call records: what each judge was asked and answered, kept with the group's results.

Pure: no I/O. The one rule: a call is kept cut (``CALL_TEXT_MAX_CHARS``) and masked of secrets' shapes;
only its error is cut of the process's known secrets too (``scoring.redact`` says why).
From the judge client to the API: docs/design-notes.md.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import orjson

from scoring.ports import JudgeCall
from scoring.redact import Redactor, redact_text

# Bounds what one call keeps in Redis: a judge prompt carries the trace's input and output (up to
# 40,000 characters each, scoring.judge_prompt); a person reading why a judge said 3 needs its
# question's head and the answer, not a megabyte per result. 1,000 results x a few calls each.
CALL_TEXT_MAX_CHARS = 4_000
# And in bytes as kept (JSON): a character may take 6 (a control character, escaped) - a hostile
# trace would otherwise make a text 24 KB, and a 20-judge result half a megabyte. Per text, and
# shared by all the texts of one result (``encode_calls``).
CALL_TEXT_MAX_BYTES = 8 * 1024
RESULT_CALLS_MAX_BYTES = 32 * 1024
# Redacted past the cut by this much, and the cut made this far before the redacted text's end:
# a secret that straddles the cut is either masked whole, or - cut short at the slice's end, where
# the redactor cannot recognise it - left out. Secrets are shorter than this.
_REDACT_MARGIN = 256


def kept(call: JudgeCall, redact: Redactor, max_chars: int = CALL_TEXT_MAX_CHARS) -> JudgeCall:
    """The call as it may be kept and shown: texts cut at ``max_chars`` characters and
    ``CALL_TEXT_MAX_BYTES`` bytes (their full lengths said in ``lengths``) and cut of secrets:
    the messages and answer of their shapes, the error of the known ones too."""
    def cut(text: str) -> str:
        return shown_text(text, max_chars, CALL_TEXT_MAX_BYTES)

    messages = tuple((role, cut(content)) for role, content in call.messages)
    lengths = (*(len(content) for _, content in call.messages), len(call.answer or ""))
    error = None if call.error is None else _within_bytes(redact(call.error, tenant_gave=tenant_texts(call)), 2_000)
    return replace(call, messages=messages, answer=None if call.answer is None else cut(call.answer),
                   error=error, lengths=lengths)


def shown_text(text: str, max_chars: int, max_bytes: int) -> str:
    """A tenant's text as it may be kept and shown to people: cut at ``max_chars`` characters and
    ``max_bytes`` bytes of JSON, and cut of secrets' shapes (``redact_text``)."""
    if len(text) <= max_chars + _REDACT_MARGIN:  # masked whole: nothing cut short before masking
        text = redact_text(text)[:max_chars]
    else:
        # Masking earlier secrets shortens the text: the partial secret at the slice's end
        # moves left, so the cut counts back from the masked text's end, not forward from 0.
        masked = redact_text(text[:max_chars + _REDACT_MARGIN])
        text = masked[:min(max_chars, len(masked) - _REDACT_MARGIN)]
    return _within_bytes(_encodable(text), max_bytes)


def tenant_texts(call: JudgeCall) -> tuple[str, ...]:
    """What the tenant steered in the call - the model it named, the messages, the answer they
    drew: an error that echoes them answers no guess (``scoring.redact``)."""
    return (call.model, *(content for _, content in call.messages), call.answer or "")


def _encodable(text: str) -> str:
    """Text UTF-8 can carry: a lone surrogate (a judge's JSON answer may hold one) replaced."""
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def _within_bytes(text: str, limit: int) -> str:
    """``text`` cut so that its JSON form takes at most ``limit`` bytes."""
    size = len(orjson.dumps(text))
    while size > limit and text:
        text = text[:max(0, int(len(text) * limit / size) - 1)]
        size = len(orjson.dumps(text))
    return text


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
                                                  "completionTokens": call.usage.completion_tokens,
                                                  "cost": call.usage.cost},
        "error": call.error, **({"cachedFrom": call.cached_from} if call.cached_from is not None else {})}


def encode_calls(members: list[tuple[str, str, tuple[JudgeCall, ...]]]) -> bytes:
    """A result's judge calls as kept with it: (ref id, member label, its calls) per member; b""
    when no member made one (nothing is kept for it). Their texts share ``RESULT_CALLS_MAX_BYTES``:
    a result of many judges keeps less of each."""
    calls = [(ref_id, member, call) for ref_id, member, member_calls in members for call in member_calls]
    if not calls:
        return b""
    texts = sum(len(call.messages) + 1 for _, _, call in calls)
    share = max(256, RESULT_CALLS_MAX_BYTES // texts)
    if share < CALL_TEXT_MAX_BYTES:
        calls = [(ref_id, member, _shared(call, share)) for ref_id, member, call in calls]
    return orjson.dumps([call_document(call, ref_id, member) for ref_id, member, call in calls],
                        option=orjson.OPT_UTC_Z)


def _shared(call: JudgeCall, limit: int) -> JudgeCall:
    return replace(call, messages=tuple((role, _within_bytes(content, limit)) for role, content in call.messages),
                   answer=None if call.answer is None else _within_bytes(call.answer, limit),
                   lengths=call.lengths or (*(len(c) for _, c in call.messages), len(call.answer or "")))
