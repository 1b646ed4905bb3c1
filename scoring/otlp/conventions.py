"""What an OpenTelemetry span said and who said it, by convention.

Input and output of a span, first found wins, in the order of the mapping table in
docs/connect/opentelemetry.md. Message lists become text the way a person reads them.
The order and the text: docs/design-notes.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

# Attributes read as a span's input or output: not copied again into its attributes.
CONTENT_ATTRIBUTES = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.prompt", "gen_ai.completion",
                      "gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "llm.input_messages",
                      "llm.output_messages", "input.value", "output.value", "traceloop.entity.input",
                      "traceloop.entity.output")
_ROLES = {"user": "User", "assistant": "Assistant", "system": "System", "tool": "Tool",
          "developer": "Developer", "model": "Assistant", "ai": "Assistant", "human": "User"}
_EVENT_ROLES = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
                "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}
_INDEXED = re.compile(r"^(\d+)\.(.+)$")
_CONTENT_TEXT = re.compile(r"^contents\.(\d+)\.message_content\.text$")
_TOOL_CALL = re.compile(r"^tool_calls\.(\d+)\.(?:tool_call\.)?(?:function\.)?(name|arguments)$")


@dataclass(frozen=True)
class Content:
    input: str | None
    output: str | None


def span_kind(name: str, attrs: dict[str, Any]) -> str | None:
    """``tool`` for tool executions (members never read them as the agent's words), else
    ``agent``, ``llm``, ``embedding``, ``retriever``, ``chain`` or None."""
    operation = str(attrs.get("gen_ai.operation.name") or "")
    openinference = str(attrs.get("openinference.span.kind") or "").upper()
    traceloop = str(attrs.get("traceloop.span.kind") or "").lower()
    if operation == "execute_tool" or openinference == "TOOL" or traceloop == "tool" \
            or name.startswith("execute_tool"):
        return "tool"
    if operation in ("invoke_agent", "create_agent") or openinference == "AGENT" or traceloop == "agent":
        return "agent"
    if operation in ("chat", "text_completion", "generate_content") or openinference == "LLM":
        return "llm"
    if operation == "embeddings" or openinference == "EMBEDDING":
        return "embedding"
    if openinference in ("RETRIEVER", "RERANKER"):
        return "retriever"
    if openinference == "CHAIN" or traceloop == "workflow":
        return "chain"
    return None


def span_content(attrs: dict[str, Any], events: list[tuple[str, dict[str, Any]]]) -> Content:
    details = next((a for n, a in events if n == "gen_ai.client.inference.operation.details"), {})
    return Content(
        input=_first(lambda: _messages_text(attrs.get("gen_ai.input.messages")),
                     lambda: _messages_text(details.get("gen_ai.input.messages")),
                     lambda: _plain(attrs.get("gen_ai.tool.call.arguments")),
                     lambda: render_messages(_indexed_messages(attrs, "llm.input_messages.")),
                     lambda: _value_text(attrs.get("input.value")),
                     lambda: _messages_text(attrs.get("gen_ai.prompt")),
                     lambda: render_messages(_indexed_messages(attrs, "gen_ai.prompt.")),
                     lambda: _event_messages(events, output=False),
                     lambda: _value_text(attrs.get("traceloop.entity.input"))),
        output=_first(lambda: _messages_text(attrs.get("gen_ai.output.messages")),
                      lambda: _messages_text(details.get("gen_ai.output.messages")),
                      lambda: _plain(attrs.get("gen_ai.tool.call.result")),
                      lambda: render_messages(_indexed_messages(attrs, "llm.output_messages.")),
                      lambda: _value_text(attrs.get("output.value")),
                      lambda: _messages_text(attrs.get("gen_ai.completion")),
                      lambda: render_messages(_indexed_messages(attrs, "gen_ai.completion.")),
                      lambda: _event_messages(events, output=True),
                      lambda: _value_text(attrs.get("traceloop.entity.output"))),
    )


def _first(*candidates: Any) -> str | None:
    for candidate in candidates:
        text = candidate()
        if text:
            return str(text)
    return None


def _plain(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else orjson.dumps(value, default=str).decode()


def _parsed(value: Any) -> Any:
    """A JSON string parsed (attributes often carry JSON), anything else as it is."""
    if isinstance(value, str) and value[:1] in ("[", "{"):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _messages_text(value: Any) -> str:
    parsed = _parsed(value)
    if isinstance(parsed, dict) and isinstance(parsed.get("messages"), list):
        parsed = parsed["messages"]
    if isinstance(parsed, list) and parsed and all(isinstance(m, dict) for m in parsed):
        return render_messages(parsed)
    return _plain(value)


def _value_text(value: Any) -> str:
    """OpenInference ``input.value`` / ``output.value``: text, or JSON holding messages."""
    parsed = _parsed(value)
    if isinstance(parsed, dict) and isinstance(parsed.get("messages"), list):
        return render_messages(parsed["messages"])
    return _plain(value)


def render_messages(messages: list[Any]) -> str:
    rendered = [(str(m.get("role") or ""), _message_text(m)) for m in messages if isinstance(m, dict)]
    rendered = [(role, text) for role, text in rendered if text]
    if len(rendered) == 1 and "[calls tool" not in rendered[0][1]:
        return rendered[0][1]
    return "\n".join(f"{_ROLES.get(role.lower(), role.capitalize() or 'Message')}: {text}"
                     for role, text in rendered)


def _message_text(message: dict[str, Any]) -> str:
    pieces: list[str] = []
    parts = message.get("parts")
    if isinstance(parts, list):  # GenAI conventions: typed parts
        for part in parts:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "text" or (kind is None and "content" in part):
                pieces.append(_plain(part.get("content")))
            elif kind == "tool_call":
                pieces.append(f"[calls tool {part.get('name', '?')}({_plain(part.get('arguments'))})]")
            elif kind == "tool_call_response":
                pieces.append(_plain(part.get("response") if "response" in part else part.get("result")))
    content = message.get("content")
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, list):  # OpenAI-style content parts
        pieces.extend(_plain(c.get("text")) for c in content if isinstance(c, dict) and c.get("text"))
    elif content is not None and not parts:
        pieces.append(_plain(content))
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            function: dict[str, Any] = call["function"] if isinstance(call.get("function"), dict) else call
            pieces.append(f"[calls tool {function.get('name', '?')}({_plain(function.get('arguments'))})]")
    return "\n".join(p for p in pieces if p).strip()


def _indexed_messages(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Flattened messages (``llm.input_messages.0.message.content``, ``gen_ai.prompt.0.content``)
    gathered back into message dicts, in index order."""
    by_index: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        match = _INDEXED.match(key[len(prefix):])
        if not match:
            continue
        index, field = int(match.group(1)), match.group(2).removeprefix("message.")
        message: dict[str, Any] = by_index.setdefault(index, {"role": "", "content": None, "texts": {}, "calls": {}})
        if field == "role":
            message["role"] = value
        elif field == "content":
            message["content"] = value
        elif text := _CONTENT_TEXT.match(field):
            message["texts"][int(text.group(1))] = value
        elif call := _TOOL_CALL.match(field):
            message["calls"].setdefault(int(call.group(1)), {})[call.group(2)] = value
    messages = []
    for index in sorted(by_index):
        gathered = by_index[index]
        texts = [gathered["texts"][i] for i in sorted(gathered["texts"])]
        content = gathered["content"] if gathered["content"] not in (None, "") else "\n".join(map(str, texts))
        calls = [{"name": c.get("name", "?"), "arguments": c.get("arguments", "")}
                 for _, c in sorted(gathered["calls"].items())]
        messages.append({"role": gathered["role"], "content": content, "tool_calls": calls})
    return messages


def _event_messages(events: list[tuple[str, dict[str, Any]]], *, output: bool) -> str:
    """The older GenAI events: the prompt/completion content events, per-role message events
    (input) and ``gen_ai.choice`` (output)."""
    messages: list[dict[str, Any]] = []
    for name, attrs in events:
        if output and name == "gen_ai.content.completion":
            return _messages_text(attrs.get("gen_ai.completion"))
        if not output and name == "gen_ai.content.prompt":
            return _messages_text(attrs.get("gen_ai.prompt"))
        if output and name == "gen_ai.choice":
            body = _parsed(attrs.get("message") or attrs.get("gen_ai.event.content") or attrs)
            message = body.get("message", body) if isinstance(body, dict) else {"content": body}
            messages.append({"role": "assistant", **message} if isinstance(message, dict) else
                            {"role": "assistant", "content": message})
        if not output and name in _EVENT_ROLES:
            body = _parsed(attrs.get("gen_ai.event.content") or attrs)
            body = body if isinstance(body, dict) else {"content": body}
            messages.append({"role": _EVENT_ROLES[name], **body})
    return render_messages(messages) if messages else ""
