"""What a judge is asked and how its answer is read: the chat messages for a rubric verdict
(0-10) on one response or a whole session, the verdict parsed out of the model's text, and an
upper bound of the tokens a call can cost, which a token budget reserves before the call. Pure:
the client that sends them is ``adapters.members.judge``.

Trace scope asks about one response, with the judge's own ``judgePrompt``. Session scope asks
the structured whole-session question built from the criteria (consistency across turns,
whether the user's need was resolved) and never uses ``judgePrompt``. Span scope asks about one
step - its kind, name, input and output - with the trace's request as context, and never uses
``judgePrompt`` either: it is written for a trace's final response, and read against a
retrieval or a tool call it would ask the wrong question.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from scoring.models import Judge
from scoring.ports import JudgeVerdict, MemberError
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


SPAN_QUESTION = (
    "Judge one step of an AI agent's work - not its final answer - against these criteria:\n{criteria}\n\n"
    "{context}The step: {kind}span \"{name}\".\n\nIts input:\n{input}\n\nIts output:\n{output}"
)
SPAN_CONTEXT = "The request the agent was working on (context only; do not grade it):\n{request}\n\n"


# A judge's graded examples, in every scope, after its criteria - one fixed format, so
# a team knows exactly what its judge reads (docs/concepts.md "Examples in a judge"). They are
# data, quoted: a reason or an input saying "ignore the criteria" is an example's text, no more.
EXAMPLES_INTRO = ("Graded examples: how people grade against these criteria. Grade the case below as "
                  "they would; do not grade the examples.")
EXAMPLE = "<example {n}>\nInput:\n{input}\n\nResponse:\n{output}\n\nRating: {rating:g}{reason}\n</example {n}>"


# A marker inside an example's text (``</example 1>``) would close its block and open a forged
# one: its ``<`` is shown as ``&lt;``, so only the format writes markers. Other text is unchanged.
_MARKER = re.compile(r"<(?=\s*/?\s*example)", re.IGNORECASE)


def _quoted(text: str) -> str:
    return _MARKER.sub("&lt;", text)


def examples_block(judge: Judge) -> str:
    """The judge's examples as its prompt shows them ("" when it has none)."""
    if not judge.examples:
        return ""
    shown = [EXAMPLE.format(n=n, input=_quoted(e.input), output=_quoted(e.output), rating=e.rating,
                            reason=f"\nWhy: {_quoted(e.reason)}" if e.reason else "")
             for n, e in enumerate(judge.examples, 1)]
    return "\n\n".join([EXAMPLES_INTRO, *shown])


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] + f"\n[... {len(text) - MAX_TEXT_CHARS} more characters cut]"


def build_messages(judge: Judge, subject: Subject) -> list[dict[str, str]]:
    """The chat messages that ask ``judge`` about ``subject``."""
    examples = examples_block(judge)
    if subject.scope == "session":
        question = SESSION_QUESTION.format(criteria=judge.criteria, turns=subject.turns,
                                           transcript=_cut(subject.transcript))
    elif subject.scope == "span":
        kind = subject.span_kind
        context = SPAN_CONTEXT.format(request=_cut(subject.context)) if subject.context else ""
        question = SPAN_QUESTION.format(criteria=judge.criteria, context=context, kind=f"{kind} " if kind else "",
                                        name=subject.span_name or "", input=_cut(subject.input),
                                        output=_cut(subject.output))
    else:
        parts = [f"Criteria:\n{judge.criteria}"]
        if judge.judge_prompt:
            parts.append(judge.judge_prompt)
        if examples:
            parts.append(examples)
        parts.append(f"Input:\n{_cut(subject.input)}")
        if judge.context == "retrieval":
            retrieved = retrieved_text(subject)
            parts.append("Retrieved context (what the agent's retrieval steps returned):\n"
                         + (_cut(retrieved) if retrieved else "(none: the trace has no retrieval step with an output)"))
        parts.append(f"Response:\n{_cut(subject.output)}")
        if subject.expected is not None:
            parts.append(f"Expected answer:\n{_cut(as_text(subject.expected))}")
        question = "\n\n".join(parts)
        examples = ""  # shown above, after the criteria
    if examples:  # session and span scope: before the question, which names the criteria
        question = f"{examples}\n\n{question}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


RETRIEVAL_KINDS = frozenset({"retriever", "retrieval"})  # OpenInference RETRIEVER, as the intake maps it


def retrieved_text(subject: Subject) -> str:
    """The outputs of the subject's retriever spans, in the trace's order, one block each."""
    blocks = []
    for span in subject.spans:
        kind, output = (span.get("kind"), span.get("output")) if isinstance(span, dict) else (span.kind, span.output)
        if kind in RETRIEVAL_KINDS and output is not None:
            text = as_text(output).strip()
            if text:
                blocks.append(text)
    return "\n---\n".join(blocks)


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


# The most tokens a judge may answer with (sent as ``max_tokens``): a verdict is a short JSON
# object, and the ceiling a token budget reserves needs a bound on the answer.
ANSWER_MAX_TOKENS = 512


def token_ceiling(judge: Judge, subject: Subject, max_tokens: int = ANSWER_MAX_TOKENS, *,
                  messages: list[dict[str, str]] | None = None) -> int:
    """At most how many tokens one call of ``judge`` on ``subject`` costs: the UTF-8 bytes of its
    messages (a byte-level BPE tokenizer, as OpenAI's, never makes more tokens than bytes), a
    few per message for the chat format, and the answer's ``max_tokens``. A ceiling, not a
    guess: on English prose a token is ~4 bytes, so the prompt part overshoots ~4x (docs/running.md).
    ``messages``: the call's, when the caller built them already."""
    messages = messages or build_messages(judge, subject)
    return sum(len(m["content"].encode()) + MESSAGE_OVERHEAD_TOKENS for m in messages) + max_tokens


MESSAGE_OVERHEAD_TOKENS = 8  # role and separators per chat message, with room to spare
