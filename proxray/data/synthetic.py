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

This module is the text and its difficulty: the tasks, ``generate_queries`` and ``recognize_task``. The simulated
models (their skills and prices, ``SimulatedPool``, the ``sim`` engine) and the embedded table they give,
``make_table``, are the pool's: ``proxray.pool.simulated``.
"""
from __future__ import annotations

import hashlib
import re

import numpy as np
import pandas as pd

# The paper's ten data sets, in Table 2's order, and the synthetic task standing in for each.
TASKS = ["svamp", "gsm8k", "hellaswag", "sciq", "social_iqa", "winogrande", "medqa", "commonsense_qa",
         "logiqa", "bbh_boolean_expressions"]

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


def calibrate(target, difficulty, slope=DIFFICULTY_SLOPE):
    """Offset b so that mean_q sigmoid(logit(target) + b - slope · d_q) equals target (bisection)."""
    base = _logit(target)
    lo, hi = -10.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        mean = np.mean(1 / (1 + np.exp(-(base + mid - slope * difficulty))))
        lo, hi = (mid, hi) if mean < target else (lo, mid)
    return base + (lo + hi) / 2


EXHAUSTED_AFTER = 200  # repeated prompts in a row after which a task's template space counts as exhausted


def generate_queries(n_per_task: int = 200, seed: int = 0, tasks=None) -> pd.DataFrame:
    """Queries with their answer and difficulty: query_id, task, prompt, answer, answer_type, difficulty."""
    rows = []
    for t in tasks or TASKS:
        # one stream per task, so a task's queries do not change when others are added
        rng = np.random.default_rng([seed, int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)])
        seen = set()
        i = tries = misses = 0
        while i < n_per_task:
            prompt, answer, structural = GENERATORS[t](rng)
            tries += 1
            if prompt in seen and tries < 50 * n_per_task and misses < EXHAUSTED_AFTER:
                misses += 1
                continue  # distinct prompts where the template space allows (a small space repeats some)
            if misses < EXHAUSTED_AFTER:  # once a run of repeats shows the space exhausted, repeats are kept
                misses = 0
            seen.add(prompt)
            difficulty = float(np.clip(structural + 0.8 * rng.normal(), -3, 3))
            kind = "number" if t in ("svamp", "gsm8k") else ("exact" if t == "bbh_boolean_expressions" else "choice")
            rows.append((f"synth{seed}-{t}-{i}", t, prompt, str(answer), kind, difficulty))
            i += 1
    return pd.DataFrame(rows, columns=["query_id", "task", "prompt", "answer", "answer_type", "difficulty"])


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
