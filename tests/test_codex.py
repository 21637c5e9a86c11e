"""The OpenAI Codex CLI through the gateway, as its users run it: the real CLI from npm (pinned, installed here, no
login), ``codex exec`` with a custom provider pointing at the CPU demo app over HTTP, in its stock configuration and
with web search and its extra tool families off. Each configuration runs a task that needs its shell tool (a
``function_call`` of ``exec_command``, the command run by Codex, its output sent back, a final message) and a plain
question, through (a) a hosted model that answers through chat completions, (b) a hosted model that serves
``/v1/responses`` itself and (c) the routed model over a pool of tool-capable members. The hosted models are a stand-in
on 127.0.0.1 (tests/agent_standin.py) that answers with tool calls in both wire formats. The OpenAI Agents SDK (pinned,
installed here from the package index) runs the same shell task through the same app, on both of its model classes
(Responses and chat completions), whole and streamed; guidellm (pinned, installed here) loads the routed model over
chat completions and Responses, four streams at once."""
import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

import background
from agent_standin import AgentStandIn
from openai_standin import key_file

pytestmark = pytest.mark.slow

CODEX = "@openai/codex@0.169.0"
AGENTS_SDK = ["openai-agents==0.24.0", "griffelib==2.4.1"]  # its other requirements are in the dev install
# guidellm and what the dev install lacks of its requirements (pip's own resolution against the dev install), pinned
GUIDELLM = ["guidellm==0.8.1", "click==8.4.2", "culsans==0.10.0", "datasets==5.2.0", "ftfy==6.3.1",
            "more-itertools==11.2.1", "eval_type_backport==0.4.0", "Faker==40.63.0", "sanic==25.12.1", "tabulate==0.10.0",
            "aiofiles==25.1.0", "aiologic==0.17.1", "html5tagger==2.0.0", "multidict==6.9.1", "multiprocess==0.70.19",
            "sanic-routing==23.12.0", "tracerite==2.6.5", "ujson==6.1.0", "wcwidth==0.9.4"]
CHAT, CHAT2, NATIVE = "hosted/chat-coder", "hosted/chat-coder-2", "hosted/resp-coder"
PROFILE = {CHAT: (0.9, 2e-5), CHAT2: (0.6, 1e-5), NATIVE: (0.8, 3e-5)}
MINIMAL = ["-c", 'web_search="disabled"', "--disable", "multi_agent", "--disable", "goals", "--disable", "plugins",
           "--disable", "apps", "--disable", "image_generation"]


# the installs wait on npm and the package index: the Codex CLI's from the suite's first modules on (~30 s, over before
# the quiet two-node module that follows them, which waits for it), so that the module's first test finds it done; the
# two pip installs with the module's first test, so that they run while the Codex tests do
background.declare("codex", ["tests/test_codex.py::test_codex"], lambda folder: (
    [["npm", "install", "--prefix", folder, "--no-audit", "--no-fund", CODEX]], None, folder), seconds=30,
    start_with="tests/test_baselines.py")
background.declare("agents-sdk", ["tests/test_codex.py::test_the_agents_sdk"], lambda folder: (
    [[sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", folder, *AGENTS_SDK]], None, folder),
    seconds=0)
background.declare("guidellm", ["tests/test_codex.py::test_guidellm"], lambda folder: (
    [[sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", folder, *GUIDELLM]], None, folder),
    seconds=0)


@pytest.fixture(scope="module")
def codex():
    """The Codex CLI as npm installs it (its binary ships in the package)."""
    if shutil.which("npm") is None:
        pytest.fail("npm is needed to install the Codex CLI (apt-get install npm)")
    done = background.result("codex", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.folder / "node_modules" / ".bin" / "codex"


@pytest.fixture(scope="module")
def app(tmp_path_factory, encoder):
    from serve_helpers import start_app, stop_app

    tmp = tmp_path_factory.mktemp("codex-app")
    key_file(tmp)  # the stand-in takes any key; the gateway reads one from the file
    standin = AgentStandIn()
    price = {"input_per_mtok": 1.0, "output_per_mtok": 4.0}
    models = [{"id": m, "engine": "openai", "source": m.split("/")[1], "base_url": standin.url,
               "api_key_file": str(tmp / "api_key"), "price": price,
               **({"protocols": ["chat", "responses"]} if m == NATIVE else {})} for m in (CHAT, CHAT2, NATIVE)]
    url = start_app(tmp, encoder, models, profile=PROFILE)
    yield url, standin
    stop_app()
    standin.stop()


def run_codex(codex, url, tmp_path, model, task, extra=()):
    home = tmp_path / f"codex-home-{uuid.uuid4().hex[:6]}"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "gateway"\n[model_providers.gateway]\nname = "gateway"\n'
        f'base_url = "{url}/v1"\nenv_key = "PROXRAY_API_KEY"\nwire_api = "responses"\n')
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "CODEX_"))}
    env.update(CODEX_HOME=str(home), PROXRAY_API_KEY="unused", NO_COLOR="1")
    done = subprocess.run([str(codex), "exec", "--skip-git-repo-check", "--ephemeral",
                           "--dangerously-bypass-approvals-and-sandbox", "--json", *extra, task],
                          cwd=work, env=env, capture_output=True, text=True, timeout=300)
    events = [json.loads(ln) for ln in done.stdout.splitlines() if ln.startswith("{")]
    return done, events


def finals(events) -> list:
    return [e["item"]["text"] for e in events if e.get("type") == "item.completed"
            and e["item"].get("type") == "agent_message"]


def commands(events) -> list:
    return [e["item"] for e in events if e.get("type") == "item.completed"
            and e["item"].get("type") == "command_execution"]


@pytest.mark.parametrize("config", ["stock", "minimal"])
@pytest.mark.parametrize("model", [CHAT, NATIVE, "proxray"])
def test_codex_runs_a_shell_task_and_answers_a_question(codex, app, tmp_path, model, config):
    url, standin = app
    extra = MINIMAL if config == "minimal" else []
    before = len(standin.requests)
    done, events = run_codex(codex, url, tmp_path, model, "Run `echo proxray-ok` in the shell and tell me its output.",
                             extra)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    ran = commands(events)
    assert ran and "echo proxray-ok" in ran[0]["command"] and "proxray-ok" in (ran[0].get("aggregated_output") or "")
    assert finals(events) == ["The command printed: proxray-ok"]
    sent = [r for r in standin.requests[before:] if r[2].get("tools")]  # Codex's (the gateway's probes offer none)
    assert len(sent) == 2  # the call, then the answer after its output
    paths = {p.rsplit("/", 1)[-1] for p, _, _ in sent}
    served = {b.get("model") for _, _, b in sent}
    if model == NATIVE:  # relayed as sent: Codex's own fields reach the model
        assert paths == {"responses"} and served == {"resp-coder"}
        assert sent[0][2]["include"] == ["reasoning.encrypted_content"] and "prompt_cache_key" in sent[0][2]
    else:  # through chat: the same turn, Codex's hints dropped and its developer messages as system
        assert paths == {"completions"}
        assert served <= {"chat-coder", "chat-coder-2"} and len(served) == 1  # the second turn stayed on its model
        assert not {"include", "prompt_cache_key", "client_metadata", "store"} & set(sent[0][2])
        assert {m["role"] for m in sent[0][2]["messages"]} <= {"system", "user", "assistant", "tool"}
    done, events = run_codex(codex, url, tmp_path, model, "What is 2 + 2? Answer in one line.", extra)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert finals(events) == ["The answer is 4."] and not commands(events)


def test_what_a_codex_request_loses_through_chat_is_named_in_the_answer(app):
    """Codex's recorded request (tests/data/codex_request.json) to the chat model: answered, and the answer names what
    was dropped (its report and the header)."""
    import httpx

    from conftest import ROOT

    url, _ = app
    rec = json.loads((ROOT / "tests/data/codex_request.json").read_text())
    body = {**rec["body"], "model": CHAT, "stream": False}
    r = httpx.post(f"{url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    dropped = ["tools[4] (namespace multi_agent_v1)", "tools[8] (web_search)", "client_metadata"]
    assert r.json()["proxray"]["dropped"] == dropped
    assert r.headers["x-proxray-dropped"] == ",".join(dropped)


AGENT = """
import asyncio, json, os, sys
from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(True)
ran = []


@function_tool
def shell(cmd: str) -> str:
    \"\"\"Runs a shell command and returns what it printed.\"\"\"
    ran.append(cmd)
    return cmd.split(" ", 1)[1] if cmd.startswith("echo ") else ""


async def main(wire, model, streamed):
    client = AsyncOpenAI(base_url=os.environ["GATEWAY"] + "/v1", api_key="unused", max_retries=0)
    kind = OpenAIResponsesModel if wire == "responses" else OpenAIChatCompletionsModel
    agent = Agent(name="coder", instructions="Use the shell tool.", tools=[shell],
                  model=kind(model=model, openai_client=client))
    task = "Run `echo agents-ok` in the shell and tell me its output."
    if streamed:
        result = Runner.run_streamed(agent, task)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, task)
    print(json.dumps({"final": result.final_output, "ran": ran}))


asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "streamed"))
"""


@pytest.fixture(scope="module")
def agents_sdk():
    """The OpenAI Agents SDK as pip installs it from the package index, in a folder of its own."""
    done = background.result("agents-sdk", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    target = done.folder
    (target / "agent_task.py").write_text(AGENT)
    return target


@pytest.mark.parametrize("wire,model,mode", [("responses", CHAT, "whole"), ("responses", NATIVE, "streamed"),
                                             ("chat", CHAT, "streamed"), ("responses", "proxray", "whole"),
                                             ("chat", "proxray", "whole")])
def test_the_agents_sdk_runs_a_tool_through_the_gateway(agents_sdk, app, wire, model, mode):
    """An Agents SDK agent with one function tool, on its Responses or its chat completions model class: the model's
    call of the tool, the tool's output sent back, the final answer; whole and streamed."""
    url, standin = app
    before = len(standin.requests)
    env = {**os.environ, "PYTHONPATH": str(agents_sdk), "GATEWAY": url}
    done = subprocess.run([sys.executable, str(agents_sdk / "agent_task.py"), wire, model, mode], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"final": "The command printed: agents-ok", "ran": ["echo agents-ok"]}
    sent = [r for r in standin.requests[before:] if r[2].get("tools")]
    assert len(sent) == 2  # the call, then the answer after its output
    served = {b.get("model") for _, _, b in sent}
    assert len(served) == 1  # both turns on one model (routed: the one the router chose)
    # a Responses turn to the model that serves /v1/responses is relayed; every other reaches it as chat completions
    native = wire == "responses" and served == {NATIVE.split("/")[1]}
    assert {p.rsplit("/", 1)[-1] for p, _, _ in sent} == ({"responses"} if native else {"completions"})


@pytest.fixture(scope="module")
def guidellm():
    """guidellm as pip installs it from the package index, in a folder of its own."""
    done = background.result("guidellm", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    target = done.folder
    return target


@pytest.mark.parametrize("request_format", ["/v1/chat/completions", "/v1/responses"])
def test_guidellm_loads_the_routed_model(guidellm, app, tmp_path, request_format):
    """``guidellm run`` as its README writes it — the openai_http backend at the gateway, model ``proxray``, four
    concurrent streams over a prompts file — completes every request and reads every answer's streamed tokens."""
    url, standin = app
    data = tmp_path / "prompts.json"
    data.write_text(json.dumps([{"prompt": f"What is {i} plus {i + 1}?"} for i in range(20)]))
    before = len(standin.requests)
    env = {**os.environ, "PYTHONPATH": str(guidellm), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "guidellm", "run",
                           "--backend", f"kind=openai_http,target={url},model=proxray,request_format={request_format}",
                           "--profile", "kind=concurrent,streams=4", "--constraint", "kind=max_requests,count=20",
                           "--data", f"kind=json_file,path={data}", "--disable-console-interactive",
                           "--output", f"kind=json,path={tmp_path / 'out.json'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    bench = json.loads((tmp_path / "out.json").read_text())["benchmarks"][0]
    # every request guidellm made, by how it ended (its metrics' request_totals count only those inside its
    # measurement window, which on a busy machine can leave out the first or the last)
    made = bench["requests"]
    assert (len(made["successful"]), len(made["errored"]), len(made["incomplete"])) == (20, 0, 0), \
        bench["metrics"]["request_totals"]
    assert len(standin.requests) - before >= 20  # each answered by a pool model
    tokens = [r["output_tokens"] for r in made["successful"]]
    assert all(t is not None and t >= 1 for t in tokens), tokens
