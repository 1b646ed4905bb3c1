"""OpenTelemetry spans to the trace model, per convention, from records built with the SDK's own
OTLP encoder: GenAI semantic conventions (current and older attributes and events), OpenInference,
OpenLLMetry; project, agent and session; tool spans; both exporter encodings; malformed input."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from scoring.otlp.mapping import MappingRules, OtlpError, assemble, buffered_spans, decode_request
from scoring.subjects import Trace, session_subject, trace_subject
from tests.support.otlp_records import Telemetry, records, span

RESOURCE = {"service.name": "support-bot", "sgw.project.id": "p-otel"}


def messages(*pairs: tuple[str, str]) -> str:
    return json.dumps([{"role": r, "parts": [{"type": "text", "content": c}]} for r, c in pairs])


def one_trace(telemetry: Telemetry, encoding: str = "otlp_proto", rules: MappingRules | None = None) -> Trace:
    ((_, value),) = records(telemetry.spans(), encoding=encoding)
    taken, rejected = buffered_spans(decode_request(value), rules or MappingRules())
    assert rejected == []
    return assemble(taken, partial=False, assembly="quiet")


def genai_agent(telemetry: Telemetry) -> None:
    with span(telemetry.tracer, "invoke_agent Helper", **{"gen_ai.operation.name": "invoke_agent",
              "gen_ai.agent.id": "agent-7", "gen_ai.agent.name": "Helper", "gen_ai.conversation.id": "conv-1"}):
        with span(telemetry.tracer, "chat gpt-4o", **{"gen_ai.operation.name": "chat",
                  "gen_ai.input.messages": messages(("system", "Be brief."), ("user", "Weather in Paris?")),
                  "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                      {"type": "tool_call", "name": "get_weather", "arguments": {"city": "Paris"}}]}])}):
            pass
        with span(telemetry.tracer, "execute_tool get_weather", **{"gen_ai.operation.name": "execute_tool",
                  "gen_ai.tool.call.arguments": '{"city":"Paris"}', "gen_ai.tool.call.result": "rain, 12C"}):
            pass
        with span(telemetry.tracer, "chat gpt-4o", **{"gen_ai.operation.name": "chat",
                  "gen_ai.input.messages": messages(("user", "Weather in Paris?")),
                  "gen_ai.output.messages": messages(("assistant", "It is raining, 12C."))}):
            pass


@pytest.mark.parametrize("encoding", ["otlp_proto", "otlp_json"])
def test_genai_agent_trace_maps_kinds_messages_agent_session_and_project(encoding: str) -> None:
    telemetry = Telemetry(**RESOURCE)
    genai_agent(telemetry)
    trace = one_trace(telemetry, encoding)
    root, first_chat, tool, second_chat = trace.spans
    assert (trace.project_id, trace.agent_id, trace.session_id) == ("p-otel", "agent-7", "conv-1")
    assert root.parent_span_id is None and root.kind == "agent" and trace.root is root
    assert [s.kind for s in trace.spans] == ["agent", "llm", "tool", "llm"]
    assert first_chat.input == "System: Be brief.\nUser: Weather in Paris?"
    assert first_chat.output == 'Assistant: [calls tool get_weather({"city":"Paris"})]'
    assert (tool.input, tool.output) == ('{"city":"Paris"}', "rain, 12C")
    assert second_chat.output == "It is raining, 12C.", "one plain message reads as its text"
    assert "gen_ai.input.messages" not in first_chat.attributes, "content is not copied twice"
    assert trace.timestamp == root.start_time
    assert trace.metadata["partial"] is False and trace.metadata["serviceName"] == "support-bot"
    subject = trace_subject(trace)
    assert "rain, 12C" not in subject.output, "a tool's result is never the agent's words"
    assert "It is raining, 12C." in subject.output


def test_both_encodings_give_the_same_trace() -> None:
    telemetry = Telemetry(**RESOURCE)
    genai_agent(telemetry)
    assert one_trace(telemetry, "otlp_proto") == one_trace(telemetry, "otlp_json")


def test_older_genai_attributes_openllmetry_and_events() -> None:
    telemetry = Telemetry(**RESOURCE)
    with span(telemetry.tracer, "agent.run") as root:
        root.set_attribute("gen_ai.prompt", "plain question")
        root.set_attribute("gen_ai.completion", json.dumps([{"role": "assistant", "content": "json answer"}]))
        with span(telemetry.tracer, "openai.chat", **{"gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "Sys",
                  "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "Flat question",
                  "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "Flat answer"}):
            pass
        with span(telemetry.tracer, "chat old-events", **{"gen_ai.operation.name": "chat"}) as chat:
            chat.add_event("gen_ai.user.message", {"content": "Event question"})
            chat.add_event("gen_ai.choice", {"index": 0, "message": json.dumps({"content": "Event answer"})})
        with span(telemetry.tracer, "chat content-events") as chat:
            chat.add_event("gen_ai.content.prompt", {"gen_ai.prompt": "Content-event question"})
            chat.add_event("gen_ai.content.completion", {"gen_ai.completion": "Content-event answer"})
    root, flat, events, content = one_trace(telemetry).spans
    assert (root.input, root.output) == ("plain question", "json answer")
    assert (flat.input, flat.output) == ("System: Sys\nUser: Flat question", "Flat answer")
    assert (events.input, events.output) == ("Event question", "Event answer")
    assert (content.input, content.output) == ("Content-event question", "Content-event answer")


def test_openinference_trace() -> None:
    telemetry = Telemetry(**{**RESOURCE, "service.name": "oi-agent"})
    with span(telemetry.tracer, "Agent", **{"openinference.span.kind": "AGENT", "session.id": "oi-session",
              "input.value": "Book a table for two", "output.value": "Booked for 8pm."}):
        with span(telemetry.tracer, "ChatCompletion", **{"openinference.span.kind": "LLM",
                  "input.value": '{"messages": [...]}', "input.mime_type": "application/json",
                  "llm.input_messages.0.message.role": "system", "llm.input_messages.0.message.content": "You book tables.",
                  "llm.input_messages.1.message.role": "user",
                  "llm.input_messages.1.message.contents.0.message_content.text": "Book a table for two",
                  "llm.output_messages.0.message.role": "assistant",
                  "llm.output_messages.0.message.tool_calls.0.tool_call.function.name": "book",
                  "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments": '{"n":2}'}):
            pass
        with span(telemetry.tracer, "book", **{"openinference.span.kind": "TOOL", "tool.name": "book",
                  "input.value": '{"n":2}', "output.value": "confirmed 20:00"}):
            pass
    trace = one_trace(telemetry)
    root, llm, tool = trace.spans
    assert (trace.agent_id, trace.session_id) == ("oi-agent", "oi-session"), "no gen_ai.agent.*: service.name"
    assert (root.kind, root.input, root.output) == ("agent", "Book a table for two", "Booked for 8pm.")
    assert llm.kind == "llm"
    assert llm.input == "System: You book tables.\nUser: Book a table for two"
    assert llm.output == 'Assistant: [calls tool book({"n":2})]'
    assert (tool.kind, tool.output) == ("tool", "confirmed 20:00")


def test_project_comes_from_the_resource_then_the_span_then_the_default() -> None:
    telemetry = Telemetry(**{"service.name": "s", "team.project": "from-resource"})
    with span(telemetry.tracer, "a"):
        pass
    other = Telemetry(**{"service.name": "s"})
    with span(other.tracer, "b", **{"team.project": "from-span"}):
        pass
    with span(other.tracer, "c"):
        pass
    request = decode_request(records([*telemetry.spans(), *other.spans()], by_trace=False)[0][1])
    taken, rejected = buffered_spans(request, MappingRules(project_attribute="team.project"))
    assert [b.project_id for b in taken] == ["from-resource", "from-span"]
    assert [(r.reason, r.trace_id) for r in rejected] == [("no_project", f"{other.spans()[1].context.trace_id:032x}")]
    assert "team.project" in rejected[0].error
    taken, rejected = buffered_spans(request, MappingRules(project_attribute="team.project", default_project="p-default"))
    assert [b.project_id for b in taken] == ["from-resource", "from-span", "p-default"] and rejected == []


def test_session_falls_back_to_a_configured_attribute() -> None:
    telemetry = Telemetry(**RESOURCE)
    with span(telemetry.tracer, "run", **{"app.thread": "thread-9"}):
        pass
    assert one_trace(telemetry).session_id is None
    assert one_trace(telemetry, rules=MappingRules(session_attribute="app.thread")).session_id == "thread-9"


def test_one_request_holding_several_traces_maps_every_span_to_its_trace() -> None:
    telemetry = Telemetry(**RESOURCE)
    for n in range(3):
        with span(telemetry.tracer, f"run {n}", **{"input.value": f"q{n}"}):
            pass
    ((key, value),) = records(telemetry.spans(), by_trace=False)
    taken, _ = buffered_spans(decode_request(value), MappingRules())
    assert key is None and len({b.trace_id for b in taken}) == 3
    assert [b.span.input for b in taken] == ["q0", "q1", "q2"]


def test_a_trace_whose_root_never_arrived_gets_an_empty_placeholder_root() -> None:
    telemetry = Telemetry(**RESOURCE)
    with span(telemetry.tracer, "invoke_agent", **{"gen_ai.operation.name": "invoke_agent"}):
        with span(telemetry.tracer, "chat", **{"gen_ai.operation.name": "chat", "gen_ai.output.messages": messages(("assistant", "partial words"))}):
            pass
        with span(telemetry.tracer, "execute_tool", **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.result": "tool words"}):
            pass
    children = [s for s in telemetry.spans() if s.parent is not None]
    taken, _ = buffered_spans(decode_request(records(children)[0][1]), MappingRules())
    trace = assemble(taken, partial=True, assembly="max_wait")
    assert trace.root.name == "(root span not received)" and trace.root.output is None
    assert trace.root.span_id == taken[0].span.parent_span_id
    assert trace.metadata["partial"] is True and trace.metadata["assembly"] == "max_wait"
    assert trace_subject(trace).output == "partial words"


def test_otel_session_with_empty_roots_splits_by_speaker() -> None:
    turns = []
    for n, (ask, answer) in enumerate([("Where is my order?", "It ships today."), ("Thanks", "Sorry for the wait.")]):
        telemetry = Telemetry(**RESOURCE)
        with span(telemetry.tracer, "invoke_agent", **{"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "s-1"}):
            with span(telemetry.tracer, "chat", **{"gen_ai.operation.name": "chat", "gen_ai.input.messages": messages(("user", ask)),
                      "gen_ai.output.messages": messages(("assistant", answer))}):
                pass
            with span(telemetry.tracer, "execute_tool", **{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.result": f"TOOL{n}"}):
                pass
        turns.append(one_trace(telemetry))
    subject = session_subject(turns)
    assert subject.output == "It ships today.\n\nSorry for the wait."
    assert "Where is my order?" in subject.input and "TOOL" not in subject.input + subject.output


@pytest.mark.parametrize("value, reason", [
    (b"\x0a\xff\xff\xff", "not_otlp"),
    (b"{not json", "not_otlp"),
    (b'{"resourceSpans": "nope"}', "not_otlp"),
    (b"[1, 2]", "not_otlp"),
    (b'{"a":' * 300 + b"1" + b"}" * 300, "not_otlp"),
])
def test_malformed_records_raise_otlp_error_with_a_reason(value: bytes, reason: str) -> None:
    with pytest.raises(OtlpError) as caught:
        decode_request(value)
    assert caught.value.reason == reason


def test_deeply_nested_attribute_values_are_bounded() -> None:
    nested: Any = "leaf"
    for _ in range(14):
        nested = {"kvlistValue": {"values": [{"key": "k", "value": nested if isinstance(nested, dict) else {"stringValue": nested}}]}}
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "sgw.project.id", "value": {"stringValue": "p"}}]},
           "scopeSpans": [{"spans": [{"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": "x",
                                      "attributes": [{"key": "deep", "value": nested}]}]}]}]}
    taken, _ = buffered_spans(decode_request(orjson.dumps(doc)), MappingRules())
    depth, value = 0, taken[0].span.attributes["deep"]
    while isinstance(value, dict):
        value, depth = value["k"], depth + 1
    assert value == "[nested too deep]" and depth <= 8


def test_spans_without_valid_ids_are_rejected_not_raised() -> None:
    doc = {"resourceSpans": [{"resource": {"attributes": [{"key": "sgw.project.id", "value": {"stringValue": "p"}}]},
           "scopeSpans": [{"spans": [{"traceId": "00" * 16, "spanId": "0" * 15 + "1", "name": "x"}]}]}]}
    taken, rejected = buffered_spans(decode_request(orjson.dumps(doc)), MappingRules())
    assert taken == [] and [r.reason for r in rejected] == ["invalid_span"]


def test_openllmetry_workflow_spans_and_system_instructions_kept_as_attributes() -> None:
    telemetry = Telemetry(**RESOURCE)
    with span(telemetry.tracer, "support.workflow", **{"traceloop.span.kind": "workflow",
              "traceloop.entity.input": '{"messages": [{"role": "user", "content": "Refund?"}]}',
              "traceloop.entity.output": "Refund issued.", "gen_ai.system_instructions": "Be kind."}):
        pass
    (root,) = one_trace(telemetry).spans
    assert (root.kind, root.input, root.output) == ("chain", "Refund?", "Refund issued.")
    assert root.attributes["gen_ai.system_instructions"] == "Be kind."
    assert "traceloop.entity.input" not in root.attributes


def test_long_names_are_cut_to_the_trace_models_limits_and_a_long_project_is_refused() -> None:
    telemetry = Telemetry(**{**RESOURCE, "service.name": "s" * 300})
    with span(telemetry.tracer, "run", **{"gen_ai.conversation.id": "c" * 300}):
        pass
    trace = one_trace(telemetry)
    assert (len(trace.agent_id), len(trace.session_id or "")) == (128, 256)
    long_project = Telemetry(**{"sgw.project.id": "p" * 129})
    with span(long_project.tracer, "run"):
        pass
    taken, rejected = buffered_spans(decode_request(records(long_project.spans())[0][1]), MappingRules())
    assert taken == [] and [r.reason for r in rejected] == ["no_project"]
