"""The Responses API's declared field fates (proxray.serve.protocols.responses.fields) against what the translator
does: every row of the table tried on its own, every field of the request model and of a request Codex really sent
(tests/data/codex_request.json) in the table, and no combination of the table's fields a 500; the Messages table
against its translator; and the relayed protocols' table (chat completions, completions: what each kind of model takes
or refuses) against the CPU engines, vLLM's own request models and every parameter of the openai SDK."""
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT
from proxray.serve.protocols.responses.fields import (DROPPED, EMPTY, GATEWAY, PASSED, REFUSED, RESPONSES,
                                                      TRANSLATED)
from proxray.serve.protocols.responses.schemas import ResponsesRequest
from proxray.serve.protocols.responses.translate import to_chat

FN = {"type": "function", "name": "add", "description": "adds", "parameters": {"type": "object"}}
# one example of each row: (the request's fields, the top-level field it is about)
SAMPLES = {
    "model": ({"model": "m"}, "model"),
    "input": ({"input": [{"role": "user", "content": "Hi."}]}, "input"),
    "input[type=reasoning]": ({"input": [{"type": "reasoning", "summary": []}, {"role": "user", "content": "Hi."}]},
                              "input"),
    "input[other type]": ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input"),
    "instructions": ({"instructions": "Be brief."}, "instructions"),
    "max_output_tokens": ({"max_output_tokens": 9}, "max_output_tokens"),
    "stream": ({"stream": True}, "stream"),
    "stream_options": ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    "temperature": ({"temperature": 0.3}, "temperature"),
    "top_p": ({"top_p": 0.9}, "top_p"),
    "parallel_tool_calls": ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    "user": ({"user": "u1"}, "user"),
    "service_tier": ({"service_tier": "flex"}, "service_tier"),
    "safety_identifier": ({"safety_identifier": "s1"}, "safety_identifier"),
    "top_logprobs": ({"top_logprobs": 2}, "top_logprobs"),
    "tools[type=function]": ({"tools": [FN]}, "tools"),
    "tools[type=namespace]": ({"tools": [{"type": "namespace", "name": "agents", "tools": [FN]}]}, "tools"),
    "tools[hosted]": ({"tools": [{"type": "web_search"}]}, "tools"),
    "tools[other type]": ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools"),
    "tool_choice": ({"tools": [FN], "tool_choice": {"type": "function", "name": "add"}}, "tool_choice"),
    "text.format": ({"text": {"format": {"type": "json_object"}}}, "text"),
    "text.verbosity": ({"text": {"verbosity": "low"}}, "text"),
    "reasoning.effort": ({"reasoning": {"effort": "low"}}, "reasoning"),
    "reasoning.summary": ({"reasoning": {"summary": "auto"}}, "reasoning"),
    "include[reasoning.encrypted_content]": ({"include": ["reasoning.encrypted_content"]}, "include"),
    "include[hosted tools' outputs]": ({"include": ["web_search_call.action.sources"]}, "include"),
    "include[other]": ({"include": ["message.output_text.logprobs"]}, "include"),
    "truncation": ({"truncation": "auto"}, "truncation"),
    "prompt": ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    "max_tool_calls": ({"max_tool_calls": 2}, "max_tool_calls"),
    "metadata": ({"metadata": {"k": "v"}}, "metadata"),
    "store": ({"store": False}, "store"),
    "previous_response_id": ({"previous_response_id": "resp_1"}, "previous_response_id"),
    "prompt_cache_key": ({"prompt_cache_key": "session-1"}, "prompt_cache_key"),
    "client_metadata": ({"client_metadata": {"x": "y"}}, "client_metadata"),
    "background": ({"background": True}, "background"),
    "conversation": ({"conversation": "conv_1"}, "conversation"),
    "proxray": ({"proxray": {"lam": 1.0}}, "proxray"),
    "any other field": ({"seed": 7}, "seed"),
}
SCHEMA_ONLY = {"background", "conversation"}  # refused by the request model before any translation
BASE = {"model": "m", "input": "Hi."}


def test_every_row_has_an_example_and_every_example_a_row():
    assert set(SAMPLES) == {f.field for f in RESPONSES}


@pytest.mark.parametrize("fate", RESPONSES, ids=lambda f: f.field)
def test_the_translator_does_what_the_table_says(fate):
    fields, name = SAMPLES[fate.field]
    body = {**BASE, **fields}
    if fate.field in SCHEMA_ONLY:  # the request model refuses these for every model
        with pytest.raises(ValueError, match=name):
            ResponsesRequest.model_validate(body)
        assert fate.chat == fate.native == REFUSED
        return
    if name == "proxray" or name == "previous_response_id":  # never reach a translation: the request model's forward
        assert name not in ResponsesRequest.model_validate(body).forward(64) and fate.chat == GATEWAY
        return
    assert_fate(fate, name, body, fields, BASE, to_chat)


def assert_fate(fate, name: str, body: dict, fields: dict, base: dict, translate) -> None:
    """What ``translate`` (a protocol's ``to_chat``) made of ``body`` is what ``fate`` declares for its field ``name``."""
    chat, problems, dropped = translate(body)
    if fate.chat == PASSED:
        assert chat[name] == body[name] and not problems and not dropped
    elif fate.chat == TRANSLATED:  # sent, but not as a copy of the field
        plain, _, _ = translate({**base, **{k: v for k, v in fields.items() if k != name}})
        assert chat != {**plain, name: body[name]} and not problems and not dropped
    elif fate.chat in (GATEWAY, EMPTY):
        assert (name == "model" or name not in chat) and not problems and not dropped
    elif fate.chat == DROPPED:  # a dropped part (field[...]) leaves the rest of its field
        assert dropped and all(name in d for d in dropped) and not problems and ("[" in fate.field or name not in chat)
    elif fate.chat == REFUSED:
        assert list(problems) == [name]
    else:
        raise AssertionError(fate.chat)


def _rows_about(name: str) -> list:
    return [f for f in RESPONSES if f.field == name or f.field.startswith((f"{name}[", f"{name}."))]


def test_every_field_of_the_request_model_and_of_a_codex_request_is_in_the_table():
    missing = [n for n in ResponsesRequest.model_fields if not _rows_about(n)]
    assert missing == []
    codex = json.loads((ROOT / "tests/data/codex_request.json").read_text())["body"]
    assert [n for n in codex if not _rows_about(n)] == []
    # and Codex's request, as it is, is refused by no rule at a chat model: what it asks is answered, dropped or named
    chat, problems, dropped = to_chat(ResponsesRequest.model_validate(codex).forward(4096))
    assert problems == {}
    assert dropped == ["tools[4] (namespace multi_agent_v1)", "tools[8] (web_search)", "client_metadata"]
    assert [t["function"]["name"] for t in chat["tools"]] == [
        "exec_command", "write_stdin", "request_user_input", "view_image", "get_goal", "create_goal", "update_goal"]
    assert {m["role"] for m in chat["messages"]} == {"system", "user"}  # Codex's developer messages as system
    assert "prompt_cache_key" not in chat and "include" not in chat and "store" not in chat


FIELD = st.sampled_from([fields for fields, _ in SAMPLES.values()])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(FIELD, min_size=1, max_size=6), st.sampled_from(["drop", "refuse"]))
def test_no_combination_of_the_tables_fields_fails_the_translation(parts, hosted):
    body = dict(BASE)
    for part in parts:
        body.update(part)
    try:
        req = ResponsesRequest.model_validate(body)
    except ValueError:
        return  # a 400 naming the field
    chat, problems, dropped = to_chat(req.forward(64), hosted)
    assert isinstance(chat["messages"], list) and all(isinstance(v, str) for v in problems.values())
    json.dumps(chat)


# ---- Messages ------------------------------------------------------------------------------------------------------
from proxray.serve.protocols.messages.fields import MESSAGES  # noqa: E402
from proxray.serve.protocols.messages.schemas import MessagesRequest  # noqa: E402
from proxray.serve.protocols.messages.translate import to_chat as messages_to_chat  # noqa: E402

MSG_BASE = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi."}]}
TOOL = {"name": "add", "description": "adds", "input_schema": {"type": "object"}}
MSG_SAMPLES = {
    "model": ({"model": "m"}, "model"),
    "max_tokens": ({"max_tokens": 9}, "max_tokens"),
    "messages": ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi."}]}]}, "messages"),
    "messages[thinking]": ({"messages": [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hm", "signature": "s"}, {"type": "text", "text": "Yes."}]},
        {"role": "user", "content": "And?"}]}, "messages"),
    "messages[other block]": ({"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "data": "x", "media_type": "text/plain"}}]}]}, "messages"),
    "system": ({"system": "Be brief."}, "system"),
    "stream": ({"stream": True}, "stream"),
    "stop_sequences": ({"stop_sequences": ["END"]}, "stop_sequences"),
    "temperature": ({"temperature": 0.3}, "temperature"),
    "top_p": ({"top_p": 0.9}, "top_p"),
    "tools[with input_schema]": ({"tools": [TOOL]}, "tools"),
    "tools[server tool]": ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools"),
    "tool_choice": ({"tools": [TOOL], "tool_choice": {"type": "any"}}, "tool_choice"),
    "metadata": ({"metadata": {"user_id": "u"}}, "metadata"),
    "thinking": ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    "top_k": ({"top_k": 5}, "top_k"),
    "service_tier": ({"service_tier": "auto"}, "service_tier"),
    "context_management": ({"context_management": {"edits": []}}, "context_management"),
    "output_config": ({"output_config": {"effort": "low"}}, "output_config"),
    "container": ({"container": "c1"}, "container"),
    "mcp_servers": ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
    "proxray": ({"proxray": {"lam": 1.0}}, "proxray"),
    "any other field": ({"unheard_of": 1}, "unheard_of"),
}


def test_every_messages_row_has_an_example_and_every_field_of_the_request_model_a_row():
    assert set(MSG_SAMPLES) == {f.field for f in MESSAGES}
    names = {f.field.split("[")[0] for f in MESSAGES}
    assert [n for n in MessagesRequest.model_fields if n not in names] == []


@pytest.mark.parametrize("fate", MESSAGES, ids=lambda f: f.field)
def test_the_messages_translator_does_what_the_table_says(fate):
    fields, name = MSG_SAMPLES[fate.field]
    body = MessagesRequest.model_validate({**MSG_BASE, **fields}).forward()
    if name == "proxray":
        assert name not in body and fate.chat == GATEWAY
        return
    assert_fate(fate, name, body, fields, MSG_BASE, messages_to_chat)


# --- chat completions and completions: relayed, each kind of model decides (proxray.serve.protocols.chat_fields)
CHAT_SAMPLES = {
    "messages": [{"role": "user", "content": "Hi."}], "prompt": "Hi.", "max_tokens": 9, "max_completion_tokens": 9,
    "stream": True, "stream_options": {"include_usage": True}, "n": 2, "temperature": 0.3, "top_p": 0.9, "seed": 1,
    "stop": ["\n"], "user": "u1", "tools": [{"type": "function", "function": {"name": "add"}}],
    "tool_choice": "required", "parallel_tool_calls": False, "response_format": {"type": "json_object"},
    "logprobs": True, "top_logprobs": 2, "logit_bias": {"50256": -100}, "presence_penalty": 0.5,
    "frequency_penalty": 0.5, "reasoning_effort": "low", "echo": True, "suffix": "!", "best_of": 2, "store": True,
    "metadata": {"a": "b"}, "prompt_cache_key": "c1", "prompt_cache_retention": "24h", "prompt_cache_options": {},
    "moderation": {}, "safety_identifier": "s1",
    "service_tier": "flex", "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "mp3"},
    "prediction": {"type": "content", "content": "x"}, "verbosity": "low", "web_search_options": {},
    "functions": [{"name": "add"}], "function_call": "auto", "any other field": ("min_p", 0.1),
}


def _chat_rows():
    from proxray.serve.protocols.chat_fields import CHAT_FIELDS

    return [f for f in CHAT_FIELDS if f.field not in ("model", "proxray")]


def _sample(row) -> tuple:
    """(the field's name, a value of it) for a row; ``any other field``'s is a field of vLLM's own."""
    return CHAT_SAMPLES[row.field] if row.field == "any other field" else (row.field, CHAT_SAMPLES[row.field])


def _engine_refuses(engine: str, chat: bool, name: str, value) -> bool:
    from proxray.serve.deployments.models import cpu_honoured, refused_parameters
    from proxray.serve.wire import CHAT_PATH, COMPLETIONS_PATH

    return refused_parameters({name: value}, cpu_honoured(engine, CHAT_PATH if chat else COMPLETIONS_PATH)) == [name]


def test_every_field_of_the_openai_sdks_chat_and_completions_requests_has_a_row():
    """The table names every parameter the openai SDK's ``chat.completions.create`` and ``completions.create`` take
    (the SDK pinned in the dev lock), and every row has an example here."""
    from openai.types import completion_create_params as completions
    from openai.types.chat import completion_create_params as chat

    from proxray.serve.protocols.chat_fields import fields_of

    for sdk, is_chat in ((chat, True), (completions, False)):
        names = set(sdk.CompletionCreateParamsBase.__annotations__) | {"stream"}
        rows = {f.field for f in fields_of(is_chat)}
        assert names - rows == set(), names - rows
    assert {f.field for f in _chat_rows()} == set(CHAT_SAMPLES)


@pytest.mark.parametrize("row", _chat_rows(), ids=lambda f: f.field)
@pytest.mark.parametrize("engine", ["sim", "transformers"])
def test_the_cpu_engines_take_or_refuse_each_field_as_the_table_says(row, engine):
    from proxray.serve.deployments.models import NOT_ASKED

    name, value = _sample(row)
    for chat in (c for c, applies in ((True, row.chat), (False, row.completions)) if applies):
        # a hint the engine does not take it would refuse too: the gateway leaves it out (``chat.HintsDropped``)
        assert _engine_refuses(engine, chat, name, value) == (row.fate(engine) in ("refused", "dropped")), (row.field,
                                                                                                          chat)
    for asked in NOT_ASKED.get(name, ()):  # the "not asked" value is taken by every engine
        assert not _engine_refuses(engine, True, name, asked)


@pytest.mark.slow
def test_a_co_hosted_vllm_model_takes_or_refuses_each_field_as_the_table_says():
    """vLLM's own request models (through ray.serve.llm, as ``VLLMModelServer`` validates a body): a field the table
    says vLLM takes is one of their fields, every other one is refused by name."""
    from ray.serve.llm.openai_api_models import ChatCompletionRequest, CompletionRequest

    from proxray.serve.deployments.models import refused_parameters

    wrong = []
    for row in _chat_rows():
        name, value = _sample(row)
        for cls, applies in ((ChatCompletionRequest, row.chat), (CompletionRequest, row.completions)):
            refused = refused_parameters({name: value}, cls.model_fields) == [name]
            if applies and refused != (row.fate("vllm") in ("refused", "dropped")):
                wrong.append((row.field, cls.__name__))
    assert wrong == []
