"""The Responses API's parts without a server: the request's translation to chat completions and back (the event
stream checked by the openai SDK's own accumulator), the stored responses' book (conversations, keys, bounds,
expiry), the request's validation and the input items' pages."""
import json
import time

import pytest
from pydantic import ValidationError

from proxray.serve.errors import RequestError
from proxray.serve.protocols.core import Usage
from proxray.serve.protocols.responses.schemas import ResponsesRequest
from proxray.serve.protocols.responses.stored import input_items_page
from proxray.serve.protocols.responses.translate import events_from_chat, from_chat, shell, to_chat
from proxray.serve.protocols.responses.turn import NamedEvents, has_content
from proxray.serve.tenancy.responses import ResponseBook

TOOL = {"type": "function", "name": "add", "description": "Add two numbers.", "strict": True,
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}


def test_a_conversation_with_tools_and_structured_output_as_chat():
    body = {"model": "m", "instructions": "Be brief.", "max_output_tokens": 40, "temperature": 0.2, "user": "u1",
            "metadata": {"k": "v"}, "store": False, "seed": 7, "tools": [TOOL], "tool_choice": {"type": "function",
                                                                                            "name": "add"},
            "text": {"format": {"type": "json_schema", "name": "sum", "schema": {"type": "object"}, "strict": True}},
            "reasoning": {"effort": "low"}, "top_logprobs": 2,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Add 2 and 3."},
                                                   {"type": "input_image", "image_url": "https://x/y.png"}]},
                      {"type": "reasoning", "id": "rs_1", "summary": []},
                      {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": "{\"a\":2,\"b\":3}"},
                      {"type": "function_call_output", "call_id": "call_1", "output": "5"},
                      {"role": "assistant", "content": [{"type": "output_text", "text": "It is 5."}]},
                      {"role": "user", "content": "Thanks."}]}
    chat, problems, dropped = to_chat(body)
    assert problems == {} and dropped == ["input[type=reasoning]"]
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Add 2 and 3."},
                                     {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "auto"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "assistant", "content": "It is 5."},
        {"role": "user", "content": "Thanks."}]
    assert chat["tools"] == [{"type": "function", "function": {k: TOOL[k] for k in ("name", "description",
                                                                                      "parameters", "strict")}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "sum", "schema": {
        "type": "object"}, "strict": True}}
    assert (chat["max_completion_tokens"], chat["temperature"], chat["user"], chat["seed"]) == (40, 0.2, "u1", 7)
    assert (chat["reasoning_effort"], chat["logprobs"], chat["top_logprobs"]) == ("low", True, 2)
    assert not {"metadata", "store", "input", "instructions", "text", "max_output_tokens"} & set(chat)


@pytest.mark.parametrize("extra, name", [
    ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"text": {"verbosity": "low"}}, "text"),
    ({"text": {"format": {"type": "grammar"}}}, "text"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"max_tool_calls": 3}, "max_tool_calls"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input")])
def test_what_has_no_chat_form_is_named(extra, name):
    _, problems, _ = to_chat({"model": "m", "input": "Hi.", **extra})
    assert list(problems) == [name]


def test_a_hosted_tool_is_dropped_and_named_or_refused_as_the_app_says():
    body = {"model": "m", "input": "Hi.", "tools": [TOOL, {"type": "web_search"}], "tool_choice": "auto"}
    chat, problems, dropped = to_chat(body)
    assert problems == {} and dropped == ["tools[1] (web_search)"] and len(chat["tools"]) == 1
    _, problems, dropped = to_chat(body, hosted_tools="refuse")
    assert list(problems) == ["tools"] and dropped == []
    chat, problems, dropped = to_chat({**body, "tools": [{"type": "web_search"}]})  # no tool left: no choice among none
    assert problems == {} and "tools" not in chat and "tool_choice" not in chat


def test_what_asks_for_reasoning_a_chat_model_does_not_return_is_answered_as_empty():
    chat, problems, dropped = to_chat({"model": "m", "input": "Hi.", "reasoning": {"summary": "auto"},
                                       "include": ["reasoning.encrypted_content"]})
    assert problems == {} and dropped == [] and not {"reasoning", "include", "reasoning_effort"} & set(chat)


def test_a_chat_completion_as_a_response():
    base = shell({"instructions": "x", "tools": [TOOL]}, "resp_1", "m", "resp_0", True)
    call = {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    obj = {"choices": [{"index": 0, "finish_reason": "length",
                        "message": {"role": "assistant", "content": "Let me", "tool_calls": [call]}}],
           "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}
    r = from_chat(obj, base)
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [o["type"] for o in r["output"]] == ["message", "function_call"]
    assert r["output"][0]["content"][0]["text"] == "Let me" and r["output"][1]["call_id"] == "call_9"
    assert r["usage"]["input_tokens"] == 11 and r["usage"]["output_tokens"] == 4 and r["usage"]["total_tokens"] == 15
    assert Usage.of_responses(r["usage"]).chat() == {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}
    assert (r["id"], r["previous_response_id"], r["instructions"], r["tools"]) == ("resp_1", "resp_0", "x", [TOOL])


def test_a_chat_stream_as_events_the_openai_sdk_accumulates():
    from openai._models import construct_type
    from openai.lib.streaming.responses._responses import ResponseStreamState
    from openai.types.responses import ResponseStreamEvent

    head = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "The "}}]},
              {**head, "choices": [{"index": 0, "delta": {"content": "sum"}}]},
              {**head, "choices": [{"index": 0, "delta": {"tool_calls": [
                  {"index": 0, "id": "call_1", "type": "function",
                   "function": {"name": "add", "arguments": "{\"a\""}}]}}]},
              {**head, "choices": [{"index": 0, "delta": {"tool_calls": [
                  {"index": 0, "function": {"arguments": ":2}"}}]}}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
              {**head, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 6}}]
    ev = events_from_chat(shell({"tools": [TOOL]}, "resp_1", "m", None, True))
    events = [e for c in chunks for e in ev.chunk(c)] + ev.end()
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    state = ResponseStreamState(input_tools=[TOOL], text_format=__import__("openai").omit)
    for e in events:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=json.loads(json.dumps(e))))
    final = state._completed_response
    assert final.output_text == "The sum"
    assert final.output[1].arguments == "{\"a\":2}" and final.output[1].call_id == "call_1"
    assert final.usage.input_tokens == 9 and final.usage.output_tokens == 6
    assert all(has_content(e) for e in events if e["type"].endswith(".delta"))
    assert not has_content(events[0]) and not has_content(events[2]) and has_content(events[-1])


def test_an_empty_stream_still_has_a_message_and_an_error_event_follows_the_sequence():
    ev = events_from_chat(shell({}, "resp_1", "m", None, False))
    events = ev.end()
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""
    fmt = NamedEvents()
    for e in events:
        fmt.event(e)
    wire = fmt.error({"error": {"message": "boom", "type": "server_error", "param": None, "code": 502}})
    name, data = wire.split("\n")[:2]
    assert name == "event: error"
    obj = json.loads(data[6:])
    assert obj["sequence_number"] == len(events) and obj["code"] == "502" and obj["error"]["message"] == "boom"


def record(n):
    return {"text": json.dumps({"n": n}), "key": None, "previous": None}


def test_the_book_rebuilds_a_conversation_and_keeps_the_one_in_use():
    T = time.time()  # the book's clock, given to every call
    book = ResponseBook(3, 100, 2**20, 1.0)  # responses, retention_s, bytes, key share
    book.remember("r1", {**record(1), "key": "a"}, now=T + 0)
    book.remember("r2", {**record(2), "key": "a", "previous": "r1"}, now=T + 1)
    book.remember("x", {**record(9), "key": "a"}, now=T + 2)
    assert [json.loads(t)["n"] for t in book.chain("r2", "a", now=T + 3)["records"]] == [1, 2]
    book.remember("r3", {**record(3), "key": "a", "previous": "r2"}, now=T + 4)  # x, least recently used, goes
    assert book.get("x", "a", now=T + 5) is None and book.chain("r3", "a", now=T + 5)["records"]
    assert book.chain("r3", "b", now=T + 5) == {"missing": "r3"}  # another key's
    assert book.delete("r1", "a") and not book.delete("r1", "a")
    assert book.chain("r3", "a", now=T + 6) == {"missing": "r1"}  # its first turn deleted
    assert book.get("r3", "a", now=T + 6) is not None and book.find("r3", "a", now=T + 6 + 101) is None  # expired


def test_one_keys_responses_cannot_push_out_anothers():
    T = time.time()
    book = ResponseBook(10, 100, 2**20, 0.5)
    book.remember("b1", {**record(0), "key": "b"}, now=T + 0)
    for i in range(20):
        book.remember(f"a{i}", {**record(i), "key": "a"}, now=T + i)
    assert book.get("b1", "b", now=T + 20) is not None and len(book.by_key["a"]) == 5


def test_three_keys_filling_the_store_leave_a_key_within_its_share_every_response():
    """Three keys at once: the store over its bounds drops from the keys furthest over their fair share (a third of
    it), never from a key within it — though that key's responses are the largest."""
    T = time.time()
    book = ResponseBook(9, 100, 2**20, 0.5)
    for i in range(3):  # key a: three large responses, its fair share of the count
        book.remember(f"a{i}", {"text": json.dumps({"n": i, "pad": "x" * 20000}), "key": "a"}, now=T + i)
    for i in range(12):  # keys b and c: many small ones each
        book.remember(f"b{i}", {**record(i), "key": "b"}, now=T + 3 + i)
        book.remember(f"c{i}", {**record(i), "key": "c"}, now=T + 3 + i)
    assert all(book.get(f"a{i}", "a", now=T + 20) is not None for i in range(3))
    assert len(book.answers) <= 9 and len(book.by_key["b"]) == len(book.by_key["c"]) == 3


def test_input_item_pages():
    rec = {"input": [{"id": f"msg_{i}", "type": "message"} for i in range(4)] + [{"type": "function_call_output"}]}
    page = input_items_page(rec, "resp_r", 2, "desc", None)
    assert [x["id"] for x in page["data"]] == ["item_r_4", "msg_3"] and page["has_more"] and page["last_id"] == "msg_3"
    page = input_items_page(rec, "resp_r", 10, "asc", "msg_2")
    assert [x["id"] for x in page["data"]] == ["msg_3", "item_r_4"] and not page["has_more"]
    for args, param in (((0, "asc", None), "limit"), ((5, "up", None), "order"), ((5, "asc", "msg_x"), "after")):
        with pytest.raises(RequestError) as e:
            input_items_page(rec, "resp_r", *args)
        assert e.value.param == param


@pytest.mark.parametrize("body, fragment", [
    ({"input": "hi", "background": True}, "background"), ({"input": "hi", "conversation": "c"}, "conversation"),
    ({"input": "  "}, "input"), ({"input": []}, "input"), ({}, "input"),
    ({"input": "hi", "metadata": {"k": "v" * 600}}, "metadata"), ({"input": "hi", "max_output_tokens": 0},
                                                                  "max_output_tokens")])
def test_the_request_is_checked_at_the_boundary(body, fragment):
    with pytest.raises(ValidationError) as e:
        ResponsesRequest.model_validate({"model": "proxray", **body})
    assert fragment in str(e.value)


def test_what_the_model_gets_leaves_out_the_gateways_own_fields():
    req = ResponsesRequest.model_validate({"model": "proxray", "input": "hi", "store": True, "previous_response_id":
                                           "resp_1", "metadata": {"a": "b"}, "proxray": {"lam": 1}, "seed": 3})
    assert req.forward(64) == {"model": "proxray", "input": "hi", "metadata": {"a": "b"}, "seed": 3,
                               "max_output_tokens": 64}


def test_a_long_translated_stream_keeps_every_delta_and_joins_each_text_once():
    """20,000 text deltas and 20,000 argument deltas: the done events and the final response hold each whole (the
    deltas are kept as pieces and joined once when the item closes, not appended to a growing string)."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    words = [f"w{i} " for i in range(20_000)]
    chunks = [{**head, "choices": [{"index": 0, "delta": {"content": w}}]} for w in words]
    chunks.append({**head, "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}}]}}]})
    chunks += [{**head, "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {
        "arguments": str(i % 10)}}]}}]} for i in range(20_000)]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    ev = events_from_chat(shell({"tools": [TOOL]}, "resp_1", "m", None, True))
    events = [e for c in chunks for e in ev.chunk(c)] + ev.end()
    done = next(e for e in events if e["type"] == "response.output_text.done")
    args = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    final = events[-1]["response"]
    assert done["text"] == "".join(words) == final["output"][0]["content"][0]["text"]
    assert args["arguments"] == "".join(str(i % 10) for i in range(20_000)) == final["output"][1]["arguments"]


def test_reasoning_items_a_model_answering_through_chat_never_read_are_not_stored():
    """A continuation's reasoning items (1 MiB each, say) are sent on only to a model that serves Responses itself; a
    model answering through chat reads none of them, so they are not stored with its response — a conversation does
    not load them again and again for nothing. A native model's record keeps them."""
    import asyncio
    from types import SimpleNamespace

    from proxray.serve.config import AppArgs
    from proxray.serve.protocols import PROTOCOLS
    from proxray.serve.protocols.base import Context
    from proxray.serve.protocols.responses.schemas import ResponsesRequest
    from proxray.serve.protocols.responses.turn import ResponsesTurn

    put = []

    class Store:
        async def put(self, rid, record, previous, key):
            put.append(record)

    args = AppArgs.model_validate({"router": "unused", "models": [{"id": "chatty", "engine": "sim"}]})
    big = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x" * (1 << 20)}
    said = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And then?"}]}
    req = ResponsesRequest.model_validate({"model": "proxray", "input": [big, said]})
    for model, native in (("chatty", set()), ("native", {"native"})):
        turn = ResponsesTurn(req, [], Context(PROTOCOLS["/v1/responses"], SimpleNamespace(), native, args, Store()))
        asyncio.run(turn.answer({"object": "response", "model": model, "output": [], "status": "completed"}, {}))
    assert [x["type"] for x in put[0]["input"]] == ["message"]  # through chat: the reasoning item left out
    assert [x["type"] for x in put[1]["input"]] == ["reasoning", "message"]  # a native model read it: kept
