"""The Messages API part by part (no Ray, no HTTP; tests/test_messages.py drives it through the running app): the
translation to and from chat completions field by field, the event stream a chat stream becomes, errors in Anthropic's
shape, the session a request belongs to, the user's ask as routing text, model aliases, tool calls on the simulated
engine."""
import json

import pytest

from proxray.serve.protocols.messages.schemas import MessagesRequest, anthropic_error
from proxray.serve.protocols.messages.translate import events_from_chat, from_chat, to_chat
from proxray.serve.protocols.messages.turn import AnthropicEvents, session_of

TOOL = {"name": "get_weather", "description": "weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}


def request(**kw):
    return MessagesRequest.model_validate({"model": "proxray", "max_tokens": 64, **kw}).forward()


def test_a_conversation_with_tools_and_images_in_chats_words():
    body = request(system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                   messages=[{"role": "system", "content": "Harness rules."},
                             {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {
                                 "type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}}]},
                             {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"},
                                                               {"type": "text", "text": "Let me look."},
                                                               {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                                "input": {"city": "Oslo"}}]},
                             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                           "content": [{"type": "text", "text": "rain"}], "is_error": True},
                                                          {"type": "text", "text": "And tomorrow?"}]}],
                   tools=[TOOL], tool_choice={"type": "any", "disable_parallel_tool_use": True}, stop_sequences=["END"],
                   temperature=0.5, top_k=5, thinking={"type": "enabled", "budget_tokens": 1024},
                   metadata={"user_id": "u"}, stream=True)
    chat, problems, dropped = to_chat(body)
    assert problems == {} and dropped == ["metadata", "thinking", "top_k", "messages[thinking]"]
    roles = [m["role"] for m in chat["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert chat["messages"][0]["content"] == "Be brief.\n\nHarness rules."
    assert chat["messages"][1]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}
    call = chat["messages"][2]["tool_calls"][0]
    assert chat["messages"][2]["content"] == "Let me look." and call["id"] == "toolu_1"
    assert json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert chat["messages"][3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "[the tool failed] rain"}
    assert chat["tool_choice"] == "required" and chat["parallel_tool_calls"] is False and chat["stop"] == ["END"]
    assert chat["tools"][0]["function"]["parameters"] == TOOL["input_schema"] and chat["max_tokens"] == 64
    assert chat["stream_options"] == {"include_usage": True} and chat["temperature"] == 0.5 and "top_k" not in chat
    named = to_chat(request(messages=[{"role": "user", "content": "x"}], tools=[TOOL],
                            tool_choice={"type": "tool", "name": "get_weather"}))[0]
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}


def test_what_chat_has_no_form_for_is_refused_by_name():
    _, problems, _ = to_chat(request(messages=[{"role": "user", "content": "x"}],
                                     tools=[{"type": "web_search_20250305", "name": "web_search"}]))
    assert "server tool" in problems["tools"]
    _, problems, _ = to_chat(request(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "data": "d"}}]}]))
    assert "'document'" in problems["messages"]


def test_a_chat_answer_as_a_message():
    obj = {"model": "m", "usage": {"prompt_tokens": 7, "completion_tokens": 3},
           "choices": [{"finish_reason": "tool_calls", "message": {
               "content": "Calling.", "reasoning_content": "think",
               "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": '{"a": 1}'}}]}}]}
    m = from_chat(obj, "m", None)
    assert [b["type"] for b in m["content"]] == ["thinking", "text", "tool_use"]
    assert m["content"][2]["input"] == {"a": 1} and m["stop_reason"] == "tool_use"
    assert m["usage"] == {"input_tokens": 7, "output_tokens": 3} and m["id"].startswith("msg_")
    stopped = {"choices": [{"finish_reason": "stop", "stop_reason": "END", "message": {"content": "x"}}]}
    assert from_chat(stopped, "m", ["END"])["stop_reason"] == "stop_sequence"
    assert from_chat(stopped, "m", ["END"])["stop_sequence"] == "END"
    assert from_chat({"choices": [{"finish_reason": "length", "message": {"content": "x"}}]}, "m", None)[
        "stop_reason"] == "max_tokens"


def test_a_chat_stream_as_messages_events_the_sdks_accumulator_reads():
    from anthropic.lib.streaming._messages import accumulate_event
    from anthropic.types import RawMessageStreamEvent
    from anthropic._models import construct_type

    events = events_from_chat("m", None)
    chunks = [{"choices": [{"delta": {"role": "assistant", "reasoning_content": "Hm."}}]},
              {"choices": [{"delta": {"content": "Sure"}}]},
              {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}]}}]},
              {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 2}"}}]}, "finish_reason": "tool_calls"}]},
              {"choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 4}}]
    out = [e for c in chunks for e in events.chunk(c)] + events.end()
    kinds = [e["type"] for e in out]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    snapshot, bufs = None, {}
    for e in out:  # the SDK's own accumulator (what messages.stream's get_final_message reads)
        snapshot = accumulate_event(event=construct_type(type_=RawMessageStreamEvent, value=e),
                                    current_snapshot=snapshot, json_bufs=bufs)
    assert [b.type for b in snapshot.content] == ["thinking", "text", "tool_use"]
    assert snapshot.content[1].text == "Sure" and snapshot.content[2].input == {"a": 2}
    assert snapshot.stop_reason == "tool_use" and snapshot.usage.input_tokens == 11 and snapshot.usage.output_tokens == 4


def test_errors_in_anthropics_shape():
    assert anthropic_error(503, "no replica") == (529, {"type": "error", "error": {
        "type": "overloaded_error", "message": "no replica"}})
    assert anthropic_error(400, "must be ≥ 1", "max_tokens")[1]["error"]["message"] == "max_tokens: must be ≥ 1"
    assert anthropic_error(413, "too big")[1]["error"]["type"] == "request_too_large"
    assert anthropic_error(504, "late") == (504, {"type": "error", "error": {"type": "api_error", "message": "late"}})
    assert anthropic_error(422, "x")[1]["error"]["type"] == "invalid_request_error"
    line = AnthropicEvents().error({"error": {"message": "the model failed mid-stream", "code": 502}})
    assert line.startswith("event: error\n") and json.loads(line.split("data: ")[1])["error"]["type"] == "api_error"


def test_a_session_and_the_users_ask():
    assert session_of({"x-claude-code-session-id": "s1"}, {"user_id": json.dumps({"session_id": "s2"})}) == "s1"
    assert session_of({}, {"user_id": json.dumps({"device_id": "d", "session_id": "s2"})}) == "s2"
    assert session_of({}, {"user_id": "plain"}) is None and session_of({}, None) is None
    from proxray.serve.protocols.base import text_of

    req = MessagesRequest.model_validate({"model": "proxray", "max_tokens": 8, "system": "HARNESS " * 5000, "messages": [
        {"role": "user", "content": "Fix the failing test"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "1 failed"}]}]})
    assert req.messages[-1].only_tool_results()
    assert text_of(req.turns(), "last_user") == "Fix the failing test"  # the ask, not the tool's output
    assert text_of(req.turns(), "system+last_user").startswith("HARNESS")
    reminded = MessagesRequest.model_validate({"model": "proxray", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>\nAs you answer the user's questions, you can use this context\n"
                                 "</system-reminder>"}, {"type": "text", "text": "What is 2 + 2?"}]}]})
    assert text_of(reminded.turns(), "last_user") == "What is 2 + 2?"  # Claude Code's reminders are not the ask


def test_aliases_exact_first_then_globs_in_order():
    from proxray.serve.config import AppArgs, ModelAlias, resolve_alias

    aliases = {"claude-*": ModelAlias(), "claude-haiku-*": ModelAlias(model="small"),
               "claude-opus-4-1": ModelAlias(lam=3.0)}
    assert resolve_alias("claude-haiku-4-5", aliases)[0] == "proxray"  # the first glob that matches, in order
    assert resolve_alias("claude-opus-4-1", aliases)[1].lam == 3.0
    assert resolve_alias("small", aliases) == ("small", None)
    base = {"router": "r", "models": [{"id": "small", "engine": "sim"}]}
    with pytest.raises(ValueError, match="model_aliases.x"):
        AppArgs(**base, model_aliases={"x": {"model": "missing"}})
    with pytest.raises(ValueError, match="apply to routing"):
        AppArgs(**base, model_aliases={"x": {"model": "small", "lam": 1.0}})


def test_the_simulated_engine_calls_the_tool_a_request_forces():
    from proxray.serve.deployments import sim_tools

    tools = [{"type": "function", "function": {"name": TOOL["name"], "parameters": TOOL["input_schema"]}}]
    assert sim_tools.forced({"tools": tools, "tool_choice": "auto"}) is None
    fn = sim_tools.forced({"tools": tools, "tool_choice": "required"})
    assert sim_tools.example(fn["parameters"]) == {"city": "example"}
    (whole,) = sim_tools.answer({"id": "x", "model": "m"}, fn, {"messages": [], "tools": tools})
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    chunks = sim_tools.answer({"id": "x"}, fn, {"messages": [], "stream": True, "stream_options": {"include_usage": True}})
    args = "".join(tc["function"]["arguments"] for c in chunks for ch in c["choices"]
                   for tc in ch["delta"].get("tool_calls") or [])
    assert json.loads(args) == {"city": "example"} and chunks[-1]["usage"]["completion_tokens"] > 0
    read = sim_tools.readable([{"role": "assistant", "content": None, "tool_calls": whole["choices"][0]["message"][
        "tool_calls"]}, {"role": "tool", "tool_call_id": "c", "content": "rain"}])
    assert read[0]["content"].startswith("[called get_weather(") and read[1] == {"role": "user",
                                                                                   "content": "[tool result] rain"}
