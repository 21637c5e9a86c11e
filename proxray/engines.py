"""Inference engines behind one interface, for the evaluation job (and later the serving path).

``engine.generate(rows, sampling) -> list of {"response", "input_tokens", "output_tokens"}`` for rows
that carry at least ``query_id``, ``task``, ``prompt``, ``answer``, ``answer_type``.

* ``TransformersEngine``: real generation on CPU with Hugging Face ``transformers`` (any causal LM
  on disk; tests build a tiny one offline with ``build_tiny_model``).
* ``SimEngine``: the synthetic world's simulated model (``proxray.synthetic``): answers are right
  with the model's simulated probability, token counts follow the task; for demos and load tests.
* vLLM runs through Ray's own ``ray.data.llm`` processor (``vllm_processor``), on GPU nodes; it is
  imported only there.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0
    max_tokens: int = 64
    seed: int = 42


def _unit(*parts) -> float:
    """A deterministic uniform number in [0, 1) from its parts (stable across processes and retries)."""
    h = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


class SimEngine:
    """A simulated model of the synthetic pool. ``model`` must be one of ``proxray.synthetic.MODELS``.

    Fault injection for tests (never on by default): ``fail_query_ids`` raise for those rows,
    ``fail_always`` for every call; ``latency_s`` sleeps per call (a slow model, for autoscaling);
    ``crash_marker`` makes the worker process exit once, the first time it sees a batch after
    ``crash_after_rows`` rows, leaving the marker file so a restarted worker goes on.
    """

    def __init__(self, model: str, seed: int = 0, fail_query_ids=(), crash_marker: str | None = None,
                 crash_after_rows: int = 0, latency_s: float = 0.0, fail_always: bool = False):
        from .synthetic import MODELS, SimulatedPool

        if model not in MODELS:
            raise ValueError(f"sim engine: model {model!r} is not in the synthetic pool ({', '.join(MODELS)})")
        self.model, self.seed = model, seed
        self.pool = SimulatedPool(models=[model], seed=seed)
        self.fail_query_ids = set(fail_query_ids)
        self.crash_marker, self.crash_after_rows = crash_marker, crash_after_rows
        self.latency_s, self.fail_always = latency_s, fail_always  # serving: a slow or a broken model
        self.rows_seen = 0

    def _p_correct(self, rows) -> np.ndarray:
        import pandas as pd

        from .synthetic import MODELS, TASKS

        df = pd.DataFrame(rows)
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
            text = (_sim_answer(r["answer"], r["answer_type"], right, r["query_id"]) if "answer" in r
                    else f"[{self.model}, simulated] An answer to: {r['prompt'][:60]}")  # live traffic has no key
            out.append({"response": text,
                        "input_tokens": int(n_in[i]), "output_tokens": int(min(n_out[i, 0], sampling.max_tokens * 4))})
        return out


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
        if getattr(self.tokenizer, "chat_template", None):
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                      add_generation_prompt=True)
        return prompt

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


def build_tiny_model(path, seed: int = 0, vocab_size: int = 512, hidden: int = 64, layers: int = 2) -> str:
    """A tiny Llama-architecture causal LM with a trained byte-level BPE tokenizer and a chat template,
    saved to ``path`` in the Hugging Face layout. Random weights: real code path, not a real model."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from .synthetic import generate_queries

    os.makedirs(path, exist_ok=True)
    corpus = generate_queries(30, seed=seed)["prompt"].tolist() + ["The answer is 42.", "(A)", "(B)", "True", "False"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<unk>", "<s>", "</s>", "<pad>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}assistant:{% endif %}")
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


def make_engine(spec) -> object:
    """The CPU engine for a model spec (``proxray.evaljob.ModelSpec``); vLLM is not built here."""
    if spec.engine == "sim":
        return SimEngine(spec.source or spec.id, **spec.engine_kwargs)
    if spec.engine == "transformers":
        return TransformersEngine(spec.source or spec.id, **spec.engine_kwargs)
    raise ValueError(f"engine {spec.engine!r} has no in-process engine (vllm runs through ray.data.llm)")


def vllm_config(spec):
    """The ``ray.data.llm.vLLMEngineProcessorConfig`` of a model spec: ``replicas`` engines of
    ``gpus_per_replica`` GPUs each (tensor parallel) on ``accelerator_type`` nodes; a row the engine
    fails on lands in an error column instead of failing the job."""
    from ray.data.llm import vLLMEngineProcessorConfig

    engine_kwargs = {"tensor_parallel_size": max(1, spec.gpus_per_replica), **spec.engine_kwargs}
    return vLLMEngineProcessorConfig(
        model_source=spec.source or spec.id, engine_kwargs=engine_kwargs, concurrency=spec.replicas,
        batch_size=spec.batch_size, accelerator_type=spec.accelerator_type, should_continue_on_error=True)


def vllm_rows(sampling: Sampling):
    """(preprocess, postprocess) row functions between query rows and ``ray.data.llm`` rows.
    Output rows: query_id, response, input_tokens, output_tokens (vLLM's own counts), error."""
    params = {"temperature": sampling.temperature, "max_tokens": sampling.max_tokens, "seed": sampling.seed}

    def preprocess(row):
        return {**row, "messages": [{"role": "user", "content": row["prompt"]}], "sampling_params": params}

    def postprocess(row):
        err = row.get("__inference_error__")
        return {"query_id": row["query_id"], "response": row.get("generated_text") or "",
                "input_tokens": int(row.get("num_input_tokens") or 0),
                "output_tokens": int(row.get("num_generated_tokens") or 0), "error": str(err) if err else None}

    return preprocess, postprocess


def vllm_processor(spec, sampling: Sampling):
    """A ``ray.data.llm`` processor running ``spec`` on vLLM (GPU nodes)."""
    from ray.data.llm import build_processor

    preprocess, postprocess = vllm_rows(sampling)
    return build_processor(vllm_config(spec), preprocess=preprocess, postprocess=postprocess)
