"""The Responses API over HTTP on a running app (127.0.0.1) with the clients users point at it: the openai SDK's
``responses.create``, ``.stream``, ``.retrieve``, ``.delete`` and ``input_items.list``, ``previous_response_id`` and
``store: false``, LangChain's ChatOpenAI with ``use_responses_api=True``, and raw HTTP for the event stream. Models
here answer through chat completions (the sim engine and a chat-only hosted API's stand-in), so every answer is
translated; tests/test_vllm_endpoint.py relays to vLLM's own ``/v1/responses``. The unrestricted key (the app's
``api_key_env``, no policy: the path of an app without keys) and two keys of the keys file (stored responses per
key)."""
import json
import os
import threading
import time

import httpx
import pytest

import serve_helpers
from openai_standin import MODEL, StandIn, key_file
from serve_helpers import BROKEN, KEY, SLOW, STRONG, WEAK, kill_under_load, start_app, stop_app

pytestmark = pytest.mark.slow
APP = "proxray-resp"
EXTERNAL = "frontier"
MIDFAIL = SLOW  # fails after its first word when streaming
KEYS: dict = {}
PRICES = {WEAK: {"input_per_mtok": 0.1, "output_per_mtok": 0.2},
          STRONG: {"input_per_mtok": 3.0, "output_per_mtok": 15.0}}
ASK = "Tom has 3 boxes of 4 apples. How many apples?"


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from proxray.serve.tenancy.keys import new_key_entry

    tmp = tmp_path_factory.mktemp("responses")
    os.environ["PROXRAY_RESP_KEY"] = KEY
    ext_key, _ = key_file(tmp)
    standin = StandIn(ext_key, faults=False)
    one = {"min_replicas": 1, "max_replicas": 1}
    models = [{"id": WEAK, "engine": "sim", "autoscaling": one, "price": PRICES[WEAK]},
              {"id": STRONG, "engine": "sim", "autoscaling": one, "price": PRICES[STRONG]},
              {"id": BROKEN, "engine": "sim", "engine_kwargs": {"fail_always": True}, "autoscaling": one},
              {"id": MIDFAIL, "engine": "sim", "engine_kwargs": {"fail_mid_stream": True}, "autoscaling": one},
              {"id": EXTERNAL, "engine": "openai", "source": MODEL, "base_url": standin.url,
               "api_key_file": str(tmp / "api_key")}]
    f = tmp / "keys.yaml"
    KEYS["a"] = new_key_entry(f, "tenant-a", budget={"usd": 10.0})
    KEYS["b"] = new_key_entry(f, "tenant-b")
    KEYS["open"] = KEY
    url = start_app(tmp, encoder, models, app_name=APP, keys_file=str(f), api_key_env="PROXRAY_RESP_KEY",
                    timeout_s=30, default_max_tokens=24, request_timeout_s=60,
                    profile={BROKEN: (1.0, 2e-6), MIDFAIL: (0.2, 9e-5), EXTERNAL: (0.1, 5e-5)})
    yield url, standin
    stop_app()
    standin.stop()


def client(app, who="open"):
    from openai import OpenAI

    return OpenAI(base_url=f"{app[0]}/v1", api_key=KEYS[who], max_retries=0, timeout=60)


def seen(model):
    return serve_helpers.seen(model, APP)


def post(app, body, who="open", path="/v1/responses"):
    return httpx.post(f"{app[0]}{path}", json=body, headers={"Authorization": f"Bearer {KEYS[who]}"}, timeout=60)


def events(app, body, who="open"):
    """(event names, their data) of a raw Responses stream."""
    names, data = [], []
    with httpx.stream("POST", f"{app[0]}/v1/responses", json={**body, "stream": True}, timeout=60,
                      headers={"Authorization": f"Bearer {KEYS[who]}"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("event: "):
                names.append(line[7:])
            elif line.startswith("data: "):
                data.append(json.loads(line[6:]))
    return names, data


def test_create_routes_and_translates_with_the_report(app):
    c = client(app)
    r = c.responses.create(model="proxray", input=ASK, instructions="Answer briefly.", max_output_tokens=12,
                           extra_body={"proxray": {"allowed_models": [WEAK, STRONG], "lam": 0.0}})
    rep = r.model_extra["proxray"]
    assert r.id.startswith("resp_") and r.object == "response" and r.status in ("completed", "incomplete")
    assert r.model == rep["model"] == STRONG and rep["routed"] and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 12
    assert r.instructions == "Answer briefly." and r.store is True and r.previous_response_id is None
    got = seen(STRONG)
    assert got["endpoint"] == "/chat/completions" and got["body"]["max_completion_tokens"] == 12
    assert got["body"]["messages"] == [{"role": "system", "content": "Answer briefly."},
                                       {"role": "user", "content": ASK}]
    assert "store" not in got["body"] and "metadata" not in got["body"]


def test_the_sdks_stream_helper_accumulates_the_same_response_it_retrieves(app):
    c = client(app)
    with c.responses.stream(model=WEAK, input="Name a colour.", max_output_tokens=10, metadata={"run": "7"}) as s:
        kinds = [e.type for e in s]
        final = s.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert "response.output_text.delta" in kinds and kinds[-1] in ("response.completed", "response.incomplete")
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert final.output_text and final.usage.output_tokens > 0 and final.metadata == {"run": "7"}
    again = c.responses.retrieve(final.id)
    assert again.output_text == final.output_text and again.model == WEAK and again.usage == final.usage
    assert again.model_extra["proxray"]["model"] == WEAK


def test_the_event_stream_on_the_wire(app):
    names, data = events(app, {"model": WEAK, "input": "Count to three.", "max_output_tokens": 8})
    assert [d["type"] for d in data] == names and names[0] == "response.created"
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert data[0]["response"]["proxray"]["model"] == WEAK and data[0]["response"]["status"] == "in_progress"
    text = "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta")
    last = data[-1]["response"]
    assert last["output"][0]["content"][0]["text"] == text and last["usage"]["output_tokens"] > 0
    assert "[DONE]" not in json.dumps(data)


def test_previous_response_id_continues_on_the_same_model_with_the_whole_conversation(app):
    c = client(app, "a")
    first = c.responses.create(model="proxray", input="Name a colour.", max_output_tokens=8,
                               extra_body={"proxray": {"allowed_models": [WEAK, STRONG], "lam": 0.0}})
    assert first.model == STRONG
    # cost decides now: without the conversation WEAK would be chosen; the conversation keeps STRONG
    second = c.responses.create(model="proxray", input="Another one, please.", previous_response_id=first.id,
                                max_output_tokens=8,
                                extra_body={"proxray": {"allowed_models": [WEAK, STRONG], "lam": 100.0}})
    rep = second.model_extra["proxray"]
    assert rep["conversation"]["id"] == first.id and rep["conversation"]["previous"] == STRONG
    assert second.model == (STRONG if rep["conversation"]["action"] == "kept" else WEAK)
    assert second.previous_response_id == first.id
    msgs = seen(second.model)["body"]["messages"]
    assert msgs == [{"role": "user", "content": "Name a colour."},
                    {"role": "assistant", "content": first.output_text},
                    {"role": "user", "content": "Another one, please."}]
    items = c.responses.input_items.list(second.id, order="asc")
    assert [i.content[0].text for i in items.data] == ["Another one, please."]  # the response's own input


def test_a_conversation_rule_switch_is_reported(app):
    c = client(app, "a")
    first = c.responses.create(model="proxray", input="Name a colour.", max_output_tokens=8,
                               extra_body={"proxray": {"allowed_models": [WEAK, STRONG], "lam": 0.0}})
    second = c.responses.create(model="proxray", input="Name a colour.", previous_response_id=first.id,
                                max_output_tokens=8,
                                extra_body={"proxray": {"allowed_models": [WEAK, STRONG], "lam": 1e6}})
    conv = second.model_extra["proxray"]["conversation"]
    assert conv["action"] == "switched" and second.model == WEAK and conv["direction"] == "step down"


def test_store_false_keeps_nothing(app):
    from openai import NotFoundError

    c = client(app)
    r = c.responses.create(model=WEAK, input="Name a colour.", store=False, max_output_tokens=6)
    assert r.store is False and r.output_text
    with pytest.raises(NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(NotFoundError) as e:
        c.responses.create(model=WEAK, input="More.", previous_response_id=r.id)
    assert e.value.body["param"] == "previous_response_id" and r.id in e.value.body["message"]


def test_unknown_previous_response_id_is_a_404_naming_it(app):
    r = post(app, {"model": "proxray", "input": "Hi there.", "previous_response_id": "resp_nope"})
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["param"] == "previous_response_id" and "resp_nope" in err["message"] and err["type"] == "not_found_error"


def test_retrieve_input_items_and_delete(app):
    from openai import NotFoundError

    c = client(app, "b")
    r = c.responses.create(model=WEAK, input=[{"role": "user", "content": "Name a colour."},
                                              {"role": "assistant", "content": "Blue."},
                                              {"role": "user", "content": "Another."}], max_output_tokens=6)
    items = c.responses.input_items.list(r.id, limit=2)  # newest first, as OpenAI lists them
    assert [i.content[0].text for i in items.data] == ["Another.", "Blue."] and items.has_more
    more = c.responses.input_items.list(r.id, limit=2, after=items.data[-1].id)
    assert [i.content[0].text for i in more.data] == ["Name a colour."] and not more.has_more
    assert c.responses.retrieve(r.id).output_text == r.output_text
    c.responses.delete(r.id)
    with pytest.raises(NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(NotFoundError):
        c.responses.delete(r.id)


def test_one_keys_stored_responses_are_unknown_to_another(app):
    from openai import NotFoundError

    a, b, open_ = client(app, "a"), client(app, "b"), client(app)
    r = a.responses.create(model=WEAK, input="A secret plan.", max_output_tokens=6)
    for other in (b, open_):
        with pytest.raises(NotFoundError):
            other.responses.retrieve(r.id)
        with pytest.raises(NotFoundError):
            other.responses.input_items.list(r.id)
        with pytest.raises(NotFoundError):
            other.responses.delete(r.id)
        with pytest.raises(NotFoundError):
            other.responses.create(model=WEAK, input="Go on.", previous_response_id=r.id)
    assert a.responses.retrieve(r.id).output_text == r.output_text  # untouched by the others' tries


@pytest.mark.parametrize("extra, name", [({"background": True}, "background"),
                                         ({"conversation": "conv_1"}, "conversation"),
                                         ({"tools": [{"type": "custom", "name": "apply_patch"}]}, "tools"),
                                         ({"text": {"format": {"type": "text"}, "verbosity": "low"}}, "text"),
                                         ({"truncation": "auto"}, "truncation"),
                                         ({"top_logprobs": 3}, "top_logprobs")])
def test_what_cannot_be_honoured_is_a_400_naming_it(app, extra, name):
    r = post(app, {"model": WEAK, "input": "Hi there.", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == name or name in err["message"], err


def test_a_hosted_tool_a_chat_model_cannot_run_is_dropped_and_named(app):
    """The app's default (responses.hosted_tools: drop): the answer comes, and says what its model was not offered."""
    r = post(app, {"model": WEAK, "input": "Hi there.", "tools": [{"type": "web_search"}], "client_metadata": {"a": "b"}})
    assert r.status_code == 200, r.text
    assert r.json()["proxray"]["dropped"] == ["tools[0] (web_search)", "client_metadata"]
    assert r.headers["x-proxray-dropped"] == "tools[0] (web_search),client_metadata"


def test_a_routed_request_leaves_out_models_that_cannot_honour_it(app):
    # the sim engine cannot honour a JSON output format; the chat-only stand-in can: routing goes there
    r = post(app, {"model": "proxray", "input": ASK, "text": {"format": {"type": "json_object"}},
                   "max_output_tokens": 8})
    assert r.status_code == 200, r.text
    rep = r.json()["proxray"]
    assert rep["model"] == EXTERNAL and set(rep["excluded"]) >= {WEAK, STRONG}
    assert all(v == ["text"] for v in rep["excluded"].values())
    sent = app[1].requests[-1][1]
    assert sent["response_format"] == {"type": "json_object"}


def test_a_stream_falls_back_before_its_first_content_and_ends_in_an_error_event_after(app):
    r = post(app, {"model": "proxray", "input": ASK, "max_output_tokens": 8,
                   "proxray": {"allowed_models": [BROKEN, WEAK], "lam": 0.0}})
    assert r.status_code == 200 and r.json()["proxray"]["fallback_from"] == [BROKEN] and r.json()["model"] == WEAK
    names, data = events(app, {"model": MIDFAIL, "input": "Count to ten.", "max_output_tokens": 12})
    assert names[0] == "response.created" and names[-1] == "error"
    assert data[-1]["error"]["code"] == 502 and data[-1]["sequence_number"] == data[-2]["sequence_number"] + 1


def test_a_keys_budget_is_charged_the_responses_usage(app):
    import ray

    def spent():
        return ray.get(ray.get_actor("proxray-keys-" + APP, namespace="proxray").report.remote())["tenant-a"]

    before = spent()["spent_usd"]
    r = client(app, "a").responses.create(model=STRONG, input=ASK, max_output_tokens=8)
    price = PRICES[STRONG]
    want = (r.usage.input_tokens * price["input_per_mtok"] + r.usage.output_tokens * price["output_per_mtok"]) / 1e6
    for _ in range(100):
        rep = spent()
        if rep["held_usd"] == 0 and rep["spent_usd"] > before:
            break
        time.sleep(0.05)
    assert rep["spent_usd"] - before == pytest.approx(want, rel=1e-6)


def test_langchain_with_use_responses_api(app):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="proxray", base_url=f"{app[0]}/v1", api_key=KEYS["open"], use_responses_api=True,
                     max_retries=0, max_tokens=10, extra_body={"proxray": {"allowed_models": [WEAK]}})
    msg = llm.invoke([("system", "Answer in one word."), ("human", "Name a colour.")])
    assert msg.text and msg.response_metadata["model_name"] == WEAK
    streamed = "".join(c.text for c in llm.stream("Name a colour."))
    assert streamed
    assert seen(WEAK)["body"]["messages"][-1] == {"role": "user", "content": "Name a colour."}


def _turns(app, stop, seen):
    """Two-turn conversations (create, then continue by previous_response_id) until ``stop``: (time, step, status)."""
    while not stop.is_set():
        try:
            r = post(app, {"model": WEAK, "input": ASK, "max_output_tokens": 4}, "a")
            seen.append((time.monotonic(), "create", r.status_code))
            if r.status_code == 200:
                r2 = post(app, {"model": "proxray", "input": "Go on.", "max_output_tokens": 4,
                                "previous_response_id": r.json()["id"]}, "a")
                seen.append((time.monotonic(), "continue", r2.status_code))
        except httpx.HTTPError as e:  # a reset or a hang: as bad as a 500
            seen.append((time.monotonic(), "create", type(e).__name__))


def test_the_store_killed_under_load_costs_no_500_and_stores_again(app):
    """Responses are held in the book's memory: a killed book comes back empty (Ray creates it anew on the next call),
    so a conversation from before is a 404 naming it and a read while it is gone a 503 — never a 500 — and answers go
    on (unstored while it is down)."""
    stop, seen = threading.Event(), []
    clients = [threading.Thread(target=_turns, args=(app, stop, seen)) for _ in range(3)]
    for t in clients:
        t.start()
    try:  # until conversations continue again after the kill
        killed = kill_under_load("proxray-responses-" + APP, seen,
                                 lambda s: sum(1 for _, step, st in s if step == "continue" and st == 200) >= 6,
                                 lambda e: e[1] == "continue" and e[2] == 200, 2.0, window=6)
    finally:
        stop.set()
        for t in clients:
            t.join(60)
    after = [(t - killed, step, s) for t, step, s in seen if t > killed]
    assert not [x for x in after if x[2] not in (200, 404, 503)], after[:10]
    assert all(s == 200 for _, step, s in after if step == "create")  # answers never wait on the store
    back = min(t for t, step, s in after if step == "continue" and s == 200 and t > 0.5)
    assert back < 15.0, back
    print(json.dumps({"after_kill": len(after), "404": sum(s == 404 for *_, s in after),
                      "503": sum(s == 503 for *_, s in after), "back_after_s": round(back, 2)}))
