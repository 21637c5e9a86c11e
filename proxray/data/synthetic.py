"""A synthetic but realistic routing world, made offline and deterministically.

SYNTHETIC: the text is real (generated from templates: arithmetic word problems, boolean
expressions, date questions, multiple-choice facts, …), but whether a model answers correctly is
*simulated*. Ten task families stand in for the paper's ten data sets, and a pool of 14 models has
per-task skill equal to the paper's Table 2 (mean accuracy of each model on each data set) and
$/M-token prices equal to its appendix B.1. Each query has a difficulty (from its structure, e.g. the
number of operations, plus noise), so queries within a task differ:

    P(correct | model m, query q of task t) = sigmoid(logit(A[m, t]) + b[m, t] - slope · difficulty_q)

with b chosen so that the mean over the task's queries matches A[m, t]. Cost = input tokens × input
price + output tokens × output price, with output lengths per task type and model verbosity.

``make_table(n_per_task, seed)`` gives the canonical long table; ``SimulatedPool`` answers single
queries the same way (the ``sim`` engine).
"""
from __future__ import annotations

import hashlib
import math
import re

import numpy as np
import pandas as pd

# The paper's ten data sets, in Table 2's order, and the synthetic task standing in for each.
TASKS = ["svamp", "gsm8k", "hellaswag", "sciq", "social_iqa", "winogrande", "medqa", "commonsense_qa",
         "logiqa", "bbh_boolean_expressions"]

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
DIFFICULTY_SLOPE = 1.2

# ---- text generators: each returns (prompt, answer, structural difficulty in ~[-1, 1]) ----------
NAMES = ["Ava", "Ben", "Chloe", "Diego", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Kira", "Liam",
         "Maya", "Noah", "Olga", "Priya", "Quinn", "Rosa", "Sam", "Tariq", "Uma", "Victor", "Wen", "Yusuf", "Zoe"]
ITEMS = ["apples", "marbles", "stickers", "pencils", "cookies", "books", "stamps", "coins", "shells", "cards",
         "balloons", "oranges", "toy cars", "beads", "tickets"]
PLACES = ["the market", "school", "the library", "the park", "the bakery", "the fair", "a yard sale", "the store"]


def _svamp(rng):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b = int(rng.integers(3, 60)), int(rng.integers(2, 30))
    kind = int(rng.integers(4))
    if kind == 0:
        return f"{name} had {a} {item}. Then {name} got {b} more at {rng.choice(PLACES)}. How many {item} does {name} have now?", a + b, -0.6
    if kind == 1:
        a = a + b
        return f"{name} had {a} {item} and gave {b} of them to a friend. How many {item} does {name} have left?", a - b, -0.3
    if kind == 2:
        c = int(rng.integers(2, 9))
        return f"There are {c} boxes and each box holds {b} {item}. How many {item} are there in all?", b * c, 0.1
    c = int(rng.integers(2, 9))
    return (f"{name} has {b * c} {item} and wants to share them equally among {c} friends. "
            f"How many {item} does each friend get?"), b, 0.4


def _gsm8k(rng):
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    steps = int(rng.integers(2, 6))
    total = int(rng.integers(10, 80))
    text = [f"{name} starts the week with {total} {item}."]
    days = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"]
    for s in range(steps):
        op = int(rng.integers(3))
        if op == 0:
            k = int(rng.integers(2, 25))
            total += k
            text.append(f"On {days[s]}, {name} buys {k} more {item} at {rng.choice(PLACES)}.")
        elif op == 1 and total > 4:
            k = int(rng.integers(1, total // 2 + 1))
            total -= k
            text.append(f"On {days[s]}, {name} gives away {k} {item}.")
        else:
            total *= 2
            text.append(f"On {days[s]}, a friend doubles {name}'s collection.")
    price = int(rng.integers(2, 9))
    text.append(f"If {name} sells every one of them for ${price} each, how many dollars does {name} earn?")
    return " ".join(text), total * price, (steps - 3.5) / 1.5


ENDINGS = [("A man is mowing the lawn in his backyard.", ["He stops to empty the grass bag into a bin.", "He dives into a swimming pool full of pudding.", "The lawn starts singing a folk song.", "He mows the clouds above the house."]),
           ("A woman is kneading dough on a floured counter.", ["She shapes it into a loaf and puts it in a pan.", "She throws the dough onto the highway.", "The dough files her taxes for her.", "She paints the dough blue and hangs it on the wall."]),
           ("A group of kids are building a sandcastle at the beach.", ["They dig a moat and fill it with sea water.", "They mail the sandcastle to the moon.", "The castle begins a career in politics.", "They eat the sand with spoons."]),
           ("A man ties his running shoes and stretches his legs.", ["He jogs off down the path along the river.", "He reads the shoes a bedtime story.", "His legs fly away like birds.", "He plants the shoes in the garden to grow."]),
           ("A girl is practicing the violin in her bedroom.", ["She plays a scale slowly, then a short melody.", "The violin cooks her dinner.", "She uses the bow to sweep the street.", "The bedroom turns into a submarine."]),
           ("A chef slices onions on a wooden cutting board.", ["He adds them to a hot pan with some oil.", "The onions start a rock band.", "He slices the cutting board into the soup.", "He wears the onions as a hat to a wedding."])]


def _hellaswag(rng):
    ctx, opts = ENDINGS[int(rng.integers(len(ENDINGS)))]
    perm = rng.permutation(4)
    letters = "ABCD"
    lines = [f"{letters[i]}) {opts[j]}" for i, j in enumerate(perm)]
    answer = letters[int(np.flatnonzero(perm == 0)[0])]
    lead = rng.choice(["Choose the most plausible continuation.", "What happens next?", "Pick the best ending."])
    return f"{lead}\n{ctx}\n" + "\n".join(lines) + "\nAnswer:", answer, float(rng.uniform(-1, 1))


FACTS = [("Which planet is known as the Red Planet?", "Mars", ["Venus", "Jupiter", "Mercury"]),
         ("What gas do plants absorb from the air for photosynthesis?", "carbon dioxide", ["oxygen", "nitrogen", "helium"]),
         ("What is the hardest natural substance?", "diamond", ["quartz", "granite", "iron"]),
         ("Which organ pumps blood through the human body?", "heart", ["liver", "lungs", "kidney"]),
         ("What is the boiling point of water at sea level in Celsius?", "100 degrees", ["90 degrees", "50 degrees", "120 degrees"]),
         ("Which particle in an atom carries a negative charge?", "electron", ["proton", "neutron", "nucleus"]),
         ("What force keeps the planets in orbit around the Sun?", "gravity", ["magnetism", "friction", "buoyancy"]),
         ("What type of rock forms from cooled lava?", "igneous", ["sedimentary", "metamorphic", "limestone"]),
         ("Which part of the cell contains genetic material?", "nucleus", ["membrane", "ribosome", "vacuole"]),
         ("What is the main source of energy for Earth's climate?", "the Sun", ["the Moon", "volcanoes", "ocean tides"]),
         ("Which vitamin is produced when skin is exposed to sunlight?", "vitamin D", ["vitamin C", "vitamin A", "vitamin K"]),
         ("What do we call animals that eat only plants?", "herbivores", ["carnivores", "omnivores", "decomposers"])]
MED = [("A 54-year-old man presents with crushing chest pain radiating to the left arm and diaphoresis. ECG shows ST elevation in leads II, III and aVF.", "inferior myocardial infarction", ["pericarditis", "pulmonary embolism", "aortic stenosis", "costochondritis"]),
       ("A 23-year-old woman has fatigue, pallor and a low mean corpuscular volume. Ferritin is decreased.", "iron deficiency anemia", ["vitamin B12 deficiency", "hemolytic anemia", "thalassemia major", "aplastic anemia"]),
       ("A 7-year-old boy presents with periorbital edema and cola-colored urine two weeks after a sore throat.", "post-streptococcal glomerulonephritis", ["minimal change disease", "IgA nephropathy", "nephrolithiasis", "urinary tract infection"]),
       ("A 65-year-old smoker has progressive dyspnea and a barrel chest. Spirometry shows a reduced FEV1/FVC ratio.", "chronic obstructive pulmonary disease", ["asthma", "pulmonary fibrosis", "sarcoidosis", "pneumothorax"]),
       ("A 30-year-old woman has heat intolerance, weight loss, tremor and exophthalmos.", "Graves disease", ["Hashimoto thyroiditis", "pheochromocytoma", "Cushing syndrome", "Addison disease"]),
       ("A 45-year-old man has sudden severe pain and swelling of the big toe after a large meal with alcohol.", "gout", ["septic arthritis", "rheumatoid arthritis", "osteoarthritis", "cellulitis"])]
COMMONSENSE = [("Where would you most likely keep milk so it stays cold?", "refrigerator", ["oven", "bookshelf", "garage roof", "mailbox"]),
               ("What do people usually do when they are tired at night?", "go to sleep", ["run a marathon", "paint the house", "start a new job", "plant trees"]),
               ("Where do you go to borrow a book for free?", "library", ["bank", "gas station", "stadium", "pharmacy"]),
               ("What would you use to cut a piece of paper?", "scissors", ["spoon", "pillow", "kettle", "blanket"]),
               ("If it is raining, what might you carry when walking outside?", "umbrella", ["sunscreen", "shovel", "kite", "ladder"]),
               ("Where is a ship most likely to be found?", "harbor", ["desert", "attic", "forest", "classroom"])]
SOCIAL = [("{a} forgot {b}'s birthday and felt terrible about it.", "How would {a} feel afterwards?", "guilty", ["proud", "bored", "excited"]),
          ("{a} helped {b} carry heavy boxes up three flights of stairs.", "What will {b} likely do next?", "thank {a}", ["ignore {a}", "move away", "laugh at {a}"]),
          ("{a} studied every night for the exam and got the highest grade.", "How would {a} feel?", "proud", ["ashamed", "confused", "angry"]),
          ("{a} spilled coffee on {b}'s new shirt at lunch.", "What should {a} do?", "apologize", ["leave quickly", "order more coffee", "blame the waiter"]),
          ("{a} lent {b} money and {b} never paid it back.", "How would {a} feel toward {b}?", "disappointed", ["grateful", "thrilled", "sleepy"])]
WINO = [("The trophy didn't fit in the suitcase because the _ was too big.", "trophy", "suitcase"),
        ("{a} gave {b} a ride home because _ had a car.", "{a}", "{b}"),
        ("The ice cream melted faster than the cake because the _ was less stable in the heat.", "ice cream", "cake"),
        ("{a} was a better swimmer than {b}, so _ won the race.", "{a}", "{b}"),
        ("The bag was lighter than the box, so the _ was easier to lift.", "bag", "box"),
        ("{a} asked {b} for advice because _ was the expert.", "{b}", "{a}")]
LOGIC = ["All {x} in the club are {y}. Some {y} are also {z}. {n} is one of the {x}.",
         "If the meeting is on {d}, then {n} will attend. {n} did not attend.",
         "Every student who passed the exam studied logic. {n} passed the exam. Some students who studied logic like {x}.",
         "No {x} are {y}. All {z} are {x}. {n} is one of the {z}."]
LOGIC_Q = [("Which statement must be true?", "{n} is {y}"), ("Which conclusion follows?", "the meeting was not on {d}"),
           ("Which must be true?", "{n} studied logic"), ("Which must be true?", "{n} is not {y}")]
GROUPS = ["painters", "runners", "chess players", "engineers", "singers", "gardeners", "bakers", "poets"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]


def _mcq(rng, stem, answer, distractors, letters="ABCDE"):
    opts = [answer, *distractors]
    perm = rng.permutation(len(opts))
    lines = [f"{letters[i]}) {opts[j]}" for i, j in enumerate(perm)]
    key = letters[int(np.flatnonzero(perm == 0)[0])]
    return stem + "\n" + "\n".join(lines) + "\nAnswer:", key


def _sciq(rng):
    q, a, d = FACTS[int(rng.integers(len(FACTS)))]
    p, key = _mcq(rng, rng.choice(["", "Science question: ", "Answer the following question. "]) + q, a, d)
    return p, key, float(rng.uniform(-1, 1))


def _social(rng):
    ctx, q, a, d = SOCIAL[int(rng.integers(len(SOCIAL)))]
    na, nb = rng.choice(NAMES, 2, replace=False)
    f = lambda s: s.format(a=na, b=nb)  # noqa: E731
    p, key = _mcq(rng, f"{f(ctx)} {f(q)}", f(a), [f(x) for x in d])
    return p, key, float(rng.uniform(-1, 1))


def _winogrande(rng):
    s, a, b = WINO[int(rng.integers(len(WINO)))]
    na, nb = rng.choice(NAMES, 2, replace=False)
    f = lambda x: x.format(a=na, b=nb)  # noqa: E731
    opts = [f(a), f(b)]
    swap = bool(rng.integers(2))
    o1, o2 = (opts[1], opts[0]) if swap else opts
    return f"{f(s)}\nA) {o1}\nB) {o2}\nAnswer:", "B" if swap else "A", float(rng.uniform(-1, 1))


def _medqa(rng):
    vignette, a, d = MED[int(rng.integers(len(MED)))]
    q = rng.choice(["Which of the following is the most likely diagnosis?", "What is the most likely cause?"])
    p, key = _mcq(rng, f"{vignette} {q}", a, d)
    return p, key, float(rng.uniform(-1, 1))


def _csqa(rng):
    q, a, d = COMMONSENSE[int(rng.integers(len(COMMONSENSE)))]
    p, key = _mcq(rng, q, a, d)
    return p, key, float(rng.uniform(-1, 1))


def _logiqa(rng):
    i = int(rng.integers(len(LOGIC)))
    x, y, z = rng.choice(GROUPS, 3, replace=False)
    vals = dict(x=x, y=y, z=z, n=rng.choice(NAMES), d=rng.choice(DAYS))
    q, a = LOGIC_Q[i]
    wrong = [f"{vals['n']} is not one of the {x}", f"all {y} are {x}", f"the meeting was on {vals['d']}"]
    p, key = _mcq(rng, LOGIC[i].format(**vals) + " " + q, a.format(**vals), wrong)
    return p, key, float(rng.uniform(-1, 1))


def _boolean(rng):
    depth = int(rng.integers(1, 5))

    def expr(d):
        if d == 0:
            return rng.choice(["True", "False"])
        op = int(rng.integers(3))
        if op == 0:
            return f"not ( {expr(d - 1)} )"
        return f"( {expr(d - 1)} ) {'and' if op == 1 else 'or'} ( {expr(d - 1)} )" if d > 1 else \
            f"{expr(0)} {'and' if op == 1 else 'or'} {expr(0)}"

    e = expr(depth)
    return f"{e} is", str(eval(e)), (depth - 2.5) / 1.5  # noqa: S307 - our own generated expression


GENERATORS = {"svamp": _svamp, "gsm8k": _gsm8k, "hellaswag": _hellaswag, "sciq": _sciq, "social_iqa": _social,
              "winogrande": _winogrande, "medqa": _medqa, "commonsense_qa": _csqa, "logiqa": _logiqa,
              "bbh_boolean_expressions": _boolean}


def _logit(p):
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p / (1 - p))


def _calibrate(target, difficulty, slope=DIFFICULTY_SLOPE):
    """Offset b so that mean_q sigmoid(logit(target) + b - slope · d_q) equals target (bisection)."""
    base = _logit(target)
    lo, hi = -10.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        mean = np.mean(1 / (1 + np.exp(-(base + mid - slope * difficulty))))
        lo, hi = (mid, hi) if mean < target else (lo, mid)
    return base + (lo + hi) / 2


def generate_queries(n_per_task: int = 200, seed: int = 0, tasks=None) -> pd.DataFrame:
    """Queries with their answer and difficulty: query_id, task, prompt, answer, answer_type, difficulty."""
    rows = []
    for t in tasks or TASKS:
        # one stream per task, so a task's queries do not change when others are added
        rng = np.random.default_rng([seed, int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)])
        seen = set()
        i = 0
        while i < n_per_task:
            prompt, answer, structural = GENERATORS[t](rng)
            if prompt in seen and len(seen) < 50 * n_per_task:
                continue  # distinct prompts where the template space allows
            seen.add(prompt)
            difficulty = float(np.clip(structural + 0.8 * rng.normal(), -3, 3))
            kind = "number" if t in ("svamp", "gsm8k") else ("exact" if t == "bbh_boolean_expressions" else "choice")
            rows.append((f"synth{seed}-{t}-{i}", t, prompt, str(answer), kind, difficulty))
            i += 1
    return pd.DataFrame(rows, columns=["query_id", "task", "prompt", "answer", "answer_type", "difficulty"])


class SimulatedPool:
    """The 14-model pool of the paper, simulated: ``p_correct``, token counts and cost per query."""

    def __init__(self, models=None, seed: int = 0):
        self.models = list(models or MODELS)
        self.seed = seed

    def p_correct(self, queries: pd.DataFrame) -> np.ndarray:
        """(n, M) probability that each model answers each query correctly."""
        P = np.zeros((len(queries), len(self.models)))
        for t, idx in queries.groupby("task").indices.items():
            d = queries["difficulty"].to_numpy()[idx]
            for j, m in enumerate(self.models):
                target = MODELS[m][0][TASKS.index(t)] / 100.0
                P[idx, j] = 1 / (1 + np.exp(-(_calibrate(target, d) - DIFFICULTY_SLOPE * d)))
        return P

    def tokens(self, queries: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """(input_tokens (n,), output_tokens (n, M)): ~1.3 tokens per word in, task length × verbosity out."""
        rng = np.random.default_rng([self.seed, 1])
        n_in = np.array([int(1.3 * len(p.split())) + 12 for p in queries["prompt"]])
        base = np.array([OUTPUT_TOKENS.get(t, 40) for t in queries["task"]], dtype=float)
        verb = np.array([MODELS[m][3] for m in self.models])
        n_out = np.maximum(1, np.round(base[:, None] * verb[None, :] * rng.lognormal(0, 0.25, (len(queries), len(self.models)))))
        return n_in, n_out.astype(int)

    def cost(self, n_in, n_out) -> np.ndarray:
        """(n, M) USD: input tokens × input price + output tokens × output price."""
        from proxray.common.pricing import token_cost

        return token_cost(np.asarray(n_in)[:, None], n_out, [MODELS[m][1] for m in self.models],
                          [MODELS[m][2] for m in self.models])


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


# ---- recognising a synthetic prompt's task (the sim engine on live traffic, which carries no task) ------
def _template_regex(template: str) -> str:
    """A template with {a}/{x}/… placeholders as a regex (placeholders match a few words)."""
    return re.sub(r"\\\{\w+\\\}", r"[\\w' ]+?", re.escape(template))


def _task_patterns() -> list:
    first = lambda ts: "(?:" + "|".join(ts) + ")"  # noqa: E731
    leads = r"(?:Science question: |Answer the following question\. )?"
    return [
        ("bbh_boolean_expressions", re.compile(r"^[\s()]*(?:(?:True|False|and|or|not)[\s()]*)+ is$")),
        ("gsm8k", re.compile(r"^[\w' ]+ starts the week with \d+ ")),
        ("svamp", re.compile(r"How many [\w ]+ (?:does \w+ have now|does \w+ have left|are there in all|does each friend get)\?$")),
        ("hellaswag", re.compile(r"^(?:Choose the most plausible continuation\.|What happens next\?|Pick the best ending\.)\n")),
        ("sciq", re.compile("^" + leads + first(re.escape(q) for q, _, _ in FACTS) + "\n")),
        ("medqa", re.compile("^" + first(re.escape(v) for v, _, _ in MED) + " ")),
        ("commonsense_qa", re.compile("^" + first(re.escape(q) for q, _, _ in COMMONSENSE) + "\n")),
        ("social_iqa", re.compile("^" + first(_template_regex(c) + " " + _template_regex(q) for c, q, _, _ in SOCIAL) + "\n")),
        ("winogrande", re.compile("^" + first(_template_regex(s) for s, _, _ in WINO) + "\nA\\) ")),
        ("logiqa", re.compile("^" + first(_template_regex(t) for t in LOGIC) + " " + first(re.escape(q) for q, _ in LOGIC_Q) + "\n")),
    ]


_PATTERNS: list | None = None


def recognize_task(prompt: str) -> str | None:
    """The synthetic task whose templates produced ``prompt``, or None for any other text. Live traffic
    carries no task: this is how the simulated pool knows how hard a routed prompt is for each model."""
    global _PATTERNS
    if _PATTERNS is None:
        _PATTERNS = _task_patterns()
    if not isinstance(prompt, str):
        return None
    for task, pattern in _PATTERNS:
        if pattern.search(prompt):
            return task
    return None
