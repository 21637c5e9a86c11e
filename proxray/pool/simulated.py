"""The simulated pool: the paper's 14 models with their per-task skill (Table 2) and prices (appendix B.1), answering
the synthetic tasks' queries (``proxray.data.synthetic``) right with a simulated probability.

* ``SimulatedPool``: P(correct), token counts and cost for a batch of queries;
* ``make_table``: the embedded default routing table (real text, SYNTHETIC correctness);
* ``SimEngine``: one simulated model behind the ``Engine`` interface (the ``sim`` engine of the job and the app).

    P(correct | model m, query q of task t) = sigmoid(logit(A[m, t]) + b[m, t] - slope · difficulty_q)

with b chosen so that the mean over the task's queries matches A[m, t]. Cost = input tokens × input price + output
tokens × output price, with output lengths per task type and model verbosity.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import time

import numpy as np
import pandas as pd

from proxray.common.hashing import unit_hash
from proxray.data.synthetic import DIFFICULTY_SLOPE, TASKS, calibrate, generate_queries, recognize_task
from proxray.pool.engine import Finish, cut_at_stop
from proxray.pool.spec import Sampling

# Table 2: mean accuracy (%) of each model on each data set (zero-shot), and appendix B.1 prices.
MODELS = {
    # name: (accuracies in TASKS order, $/M input, $/M output, verbosity)
    "Qwen/Qwen2-1.5B-Instruct": ([23.29, 68.05, 30.60, 56.15, 51.05, 54.30, 22.10, 41.95, 31.20, 44.80], 0.015, 0.030, 1.0),
    "Qwen/Qwen2-7B-Instruct": ([51.43, 29.85, 77.30, 90.80, 82.05, 73.10, 48.50, 77.55, 53.60, 72.80], 0.040, 0.080, 1.1),
    "deepseek-ai/deepseek-math-7b-instruct": ([67.86, 77.05, 35.20, 68.05, 61.35, 52.40, 24.20, 44.30, 35.70, 57.60], 0.040, 0.080, 1.3),
    "google/gemma-2b-it": ([22.57, 4.05, 31.80, 55.50, 50.25, 50.90, 23.50, 36.85, 30.00, 56.80], 0.015, 0.030, 0.9),
    "google/gemma-7b-it": ([52.71, 13.10, 50.75, 81.95, 70.95, 57.60, 32.50, 62.05, 38.60, 64.80], 0.030, 0.050, 1.0),
    "microsoft/Phi-3-small-8k-instruct": ([65.43, 17.55, 79.20, 94.10, 82.05, 85.30, 58.40, 75.50, 54.70, 76.00], 0.025, 0.050, 1.2),
    "meta-llama/Llama-2-7b-chat-hf": ([39.14, 7.00, 47.60, 76.50, 63.85, 51.90, 26.10, 49.95, 38.00, 44.80], 0.020, 0.040, 1.5),
    "meta-llama/Llama-2-13b-chat-hf": ([47.29, 12.10, 57.75, 80.65, 67.90, 55.60, 32.50, 55.95, 40.40, 54.40], 0.050, 0.100, 1.5),
    "meta-llama/Llama-3.2-1B-Instruct": ([14.14, 4.50, 27.35, 47.40, 40.60, 51.70, 22.80, 25.55, 26.05, 51.20], 0.010, 0.020, 1.0),
    "meta-llama/Llama-3.2-3B-Instruct": ([35.29, 12.90, 44.40, 91.75, 70.85, 53.40, 46.80, 65.85, 38.25, 60.00], 0.015, 0.030, 1.0),
    "meta-llama/Llama-3.1-8B-Instruct": ([37.14, 44.10, 53.00, 91.50, 72.95, 58.10, 46.00, 68.35, 43.00, 64.80], 0.030, 0.050, 1.1),
    "meta-llama/Llama-3.3-70B-Instruct": ([86.29, 40.80, 87.05, 97.65, 83.40, 83.80, 84.70, 80.45, 60.45, 79.20], 0.150, 0.300, 1.2),
    "mistralai/Mistral-7B-Instruct-v0.3": ([52.00, 22.55, 69.55, 85.55, 74.50, 59.30, 45.40, 68.15, 45.85, 74.40], 0.020, 0.050, 1.1),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": ([59.57, 26.15, 74.10, 87.05, 71.85, 68.60, 53.90, 67.65, 50.35, 82.40], 0.100, 0.250, 1.2),
}
LARGEST = "meta-llama/Llama-3.3-70B-Instruct"
# Typical answer lengths (tokens): math is worked out step by step, multiple choice is a letter and a reason.
OUTPUT_TOKENS = {"svamp": 90, "gsm8k": 180, "hellaswag": 25, "sciq": 20, "social_iqa": 25, "winogrande": 15,
                 "medqa": 40, "commonsense_qa": 20, "logiqa": 60, "bbh_boolean_expressions": 30}

def generic_profile(model: str) -> tuple:
    """The simulated profile of a model the synthetic world does not know (a rehearsal of a real pool): each task's
    skill the pool's mean, moved by up to ±10 points by a hash of the id and the task (so two unknown models differ),
    the pool's median prices, verbosity 1."""
    skills = np.mean([v[0] for v in MODELS.values()], axis=0)
    skills = [float(np.clip(s + 20 * (unit_hash(model, t, "skill") - 0.5), 1, 99)) for s, t in zip(skills, TASKS)]
    return (skills, float(np.median([v[1] for v in MODELS.values()])),
            float(np.median([v[2] for v in MODELS.values()])), 1.0)


def profile(model: str, generic: bool = False) -> tuple:
    """(skills in TASKS order, $/M input, $/M output, verbosity) of a simulated model; ``generic``: a model the
    synthetic world does not know gets ``generic_profile`` instead of an error."""
    if model in MODELS:
        return MODELS[model]
    if generic:
        return generic_profile(model)
    raise ValueError(f"sim engine: model {model!r} is not in the synthetic pool ({', '.join(MODELS)}); a rehearsal "
                     "(--simulate) gives any other id a generic profile")


class SimulatedPool:
    """The 14-model pool of the paper, simulated: ``p_correct``, token counts and cost per query. ``generic``: models
    the synthetic world does not know get a generic profile (``generic_profile``)."""

    def __init__(self, models=None, seed: int = 0, generic: bool = False):
        self.models = list(models or MODELS)
        self.seed = seed
        self.profiles = {m: profile(m, generic) for m in self.models}

    def p_correct(self, queries: pd.DataFrame) -> np.ndarray:
        """(n, M) probability that each model answers each query correctly."""
        P = np.zeros((len(queries), len(self.models)))
        for t, idx in queries.groupby("task").indices.items():
            d = queries["difficulty"].to_numpy()[idx]
            for j, m in enumerate(self.models):
                target = self.profiles[m][0][TASKS.index(t)] / 100.0
                P[idx, j] = 1 / (1 + np.exp(-(calibrate(target, d) - DIFFICULTY_SLOPE * d)))
        return P

    def tokens(self, queries: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(input_tokens (n,), output_tokens (n, M)): ~1.3 tokens per word in, task length × verbosity out."""
        rng = np.random.default_rng([self.seed, 1])
        n_in = np.array([int(1.3 * len(p.split())) + 12 for p in queries["prompt"]])
        base = np.array([OUTPUT_TOKENS.get(t, 40) for t in queries["task"]], dtype=float)
        verb = np.array([self.profiles[m][3] for m in self.models])
        n_out = np.maximum(1, np.round(base[:, None] * verb[None, :] * rng.lognormal(0, 0.25, (len(queries), len(self.models)))))
        return n_in, n_out.astype(int)

    def cost(self, n_in, n_out) -> np.ndarray:
        """(n, M) USD: input tokens × input price + output tokens × output price."""
        from proxray.common.pricing import token_cost

        return token_cost(np.asarray(n_in)[:, None], n_out, [self.profiles[m][1] for m in self.models],
                          [self.profiles[m][2] for m in self.models])


def make_table(n_per_task: int = 200, seed: int = 0, tasks=None):
    """The embedded default routing table (SYNTHETIC correctness, real text): a RoutingTable."""
    from proxray.data.table import RoutingTable

    q = generate_queries(n_per_task, seed, tasks)
    pool = SimulatedPool(seed=seed)
    P = pool.p_correct(q)
    correct = (np.random.default_rng([seed, 2]).uniform(size=P.shape) < P).astype(float)
    n_in, n_out = pool.tokens(q)
    cost = pool.cost(n_in, n_out)
    M = len(pool.models)
    df = pd.DataFrame({
        "query_id": np.repeat(q.query_id.to_numpy(), M), "task": np.repeat(q.task.to_numpy(), M),
        "prompt": np.repeat(q.prompt.to_numpy(), M), "model": np.tile(pool.models, len(q)),
        "correct": correct.reshape(-1), "cost": cost.reshape(-1), "split": "synthetic",
        "input_tokens": np.repeat(n_in, M), "output_tokens": n_out.reshape(-1)})
    return RoutingTable(df, source="synthetic table")


def table2(table) -> pd.DataFrame:
    """Model × task mean accuracy (%) of a table, in Table 2's layout."""
    return (100 * table.df.groupby(["model", "task"])["correct"].mean()).unstack().round(2)


assert all(len(v[0]) == len(TASKS) for v in MODELS.values()) and math.isclose(len(MODELS), 14)



class SimEngine:
    """A simulated model of the synthetic pool. ``model`` must be one of ``MODELS``, or any id with ``generic=True``
    (a rehearsal of a real pool: ``rehearsal``).

    Fault injection for tests (never on by default): ``fail_query_ids`` raise for those rows,
    ``fail_always`` for every call; ``latency_s`` sleeps per call (a slow model, for autoscaling);
    ``crash_marker`` makes the worker process exit once, the first time it sees a batch after
    ``crash_after_rows`` rows, leaving the marker file so a restarted worker goes on;
    ``fail_mid_stream`` (serving) fails a stream after its first word; ``word_latency_s`` (serving) sleeps
    before each streamed word (a long generation, for client-disconnect tests).

    ``table`` (a routing table's path or URI, or ``embedded``): the prompts it holds are answered right or wrong as it records for this
    model — a model that answers a prompt it was evaluated on as it did then.

    Live traffic (rows without an answer key): the task is recognised from the text
    (``recognize_task``), so a routed prompt is as hard for each model as in the table; the
    response says, in a bracket a judge can read, whether the simulated answer is right (drawn from the text, so
    the answer a user was served and the one an evaluation of the same prompt gets are right or wrong alike):
    ``[<model>, simulated, correct] …``. As a **judge** (a prompt that quotes such a response, e.g. the
    evaluation job's rubric prompt) the model answers ``Score: 1`` or ``Score: 0`` — the verdict in the
    bracket, flipped with probability ``judge_error`` (a judge is not perfect). A rubric prompt (one that asks
    for ``Score: X``) about a response it cannot read — a real model's, in a mixed pool — gets ``Score: 1`` with the
    probability the judge model itself would answer the row right: a stand-in verdict, seeded per row.
    """

    def __init__(self, model: str, seed: int = 0, fail_query_ids=(), crash_marker: str | None = None,
                 crash_after_rows: int = 0, latency_s: float = 0.0, fail_always: bool = False,
                 fail_mid_stream: bool = False, judge_error: float = 0.05, word_latency_s: float = 0.0,
                 generic: bool = False, table: str | None = None):
        self.model, self.seed = model, seed
        self.replay = _replay(table, model) if table else {}
        self.pool = SimulatedPool(models=[model], seed=seed, generic=generic)
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

        df = pd.DataFrame(rows)
        unknown = ~df["task"].isin(TASKS) if "task" in df else np.ones(len(df), bool)
        if np.any(unknown):  # live traffic: the task from the text, where the text is synthetic
            df["task"] = [recognize_task(p) or t if u else t
                          for p, t, u in zip(df["prompt"], df.get("task", [None] * len(df)), unknown)]
        if "difficulty" not in df:  # queries from elsewhere: a stable pseudo-difficulty from the text
            df["difficulty"] = [2 * unit_hash("difficulty", p) - 1 for p in df["prompt"]]
        p = np.full(len(df), np.mean(self.pool.profiles[self.model][0]) / 100.0)
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
            right = unit_hash(self.seed, self.model, r["query_id"], "correct") < p[i]
            verdict = _SIM_VERDICT.search(r["prompt"]) if isinstance(r["prompt"], str) else None
            if verdict is not None:  # judging a simulated response
                flip = unit_hash(self.seed, self.model, r["query_id"], "judge") < self.judge_error
                text = f"Score: {int((verdict.group(1) == 'correct') != flip)}"
                n_out[i] = 4
            elif isinstance(r["prompt"], str) and _JUDGE_ASK.search(r["prompt"]):  # judging a real model's answer
                text = f"Score: {int(right)}"
                n_out[i] = 4
            elif _has_key(r):
                text = _sim_answer(r["answer"], r["answer_type"], right, r["query_id"])
            else:  # live traffic has no key: say (for a judge) whether the simulated answer is right — the same
                # verdict for the same text, served or evaluated (a model answers one prompt one way)
                right = self.replay[r["prompt"]] if r["prompt"] in self.replay else \
                    unit_hash(self.seed, self.model, "text", str(r["prompt"]), "correct") < p[i]
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
        cut = cut_at_stop(answer, stop)
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
def _replay(path: str, model: str) -> dict:
    """prompt → right? of ``model`` in the routing table at ``path`` (a path or a URI; ``embedded``: ``make_table()``)."""
    from proxray.data.table import RoutingTable

    df = (make_table() if path == "embedded" else RoutingTable.read(path)).df
    df = df[df["model"] == model]
    return {p: bool(c > 0.5) for p, c in zip(df["prompt"], df["correct"])}


_JUDGE_ASK = re.compile(r"['\"]?Score: X['\"]?")  # a rubric prompt (the evaluation job's default asks so)


def _has_key(row: dict) -> bool:
    a = row.get("answer")
    return isinstance(a, str) and a != "" and row.get("answer_type") in ("number", "choice", "exact")


def _sim_answer(answer: str, answer_type: str, right: bool, key: str) -> str:
    if answer_type == "number":
        value = answer if right else str(int(float(answer)) + 1 + int(unit_hash(key, "off") * 9))
        return f"Let me work it out step by step. The answer is {value}."
    if answer_type == "choice":
        letter = answer if right else "ABCD".replace(answer, "")[int(unit_hash(key, "l") * 3) % 3]
        return f"({letter})"
    flip = {"True": "False", "False": "True"}
    return answer if right else flip.get(answer, "I am not sure.")


def rehearsal(spec):
    """The simulated stand-in of a pool model (``proxray.pool.spec.PoolModel``) for a rehearsal (``--simulate``): the
    sim engine under the same id (a model the synthetic world does not know gets a generic profile), the same price,
    autoscaling and placement — accelerator type, CPUs, and one replica's GPUs (``replica_gpus``) — so a GPU config
    runs on a CPU machine whose Ray cluster declares those GPUs."""
    if spec.engine == "sim":
        return spec
    return spec.model_copy(update={
        "engine": "sim", "source": None, "engine_kwargs": {} if spec.id in MODELS else {"generic": True},
        "num_gpus": spec.replica_gpus(), "placement_group_config": None, "runtime_env": None,
        "base_url": None, "api_key_env": None, "api_key_file": None, "rate_limit": None})

