import numpy as np

from proxray.data.synthetic import TASKS, generate_queries

from proxray.pool.simulated import MODELS, SimulatedPool, make_table, table2


def test_deterministic_and_real_text():
    a, b = make_table(30, seed=0), make_table(30, seed=0)
    assert a.query_ids == b.query_ids and a.prompts == b.prompts
    np.testing.assert_array_equal(a.matrices()[0], b.matrices()[0])
    assert make_table(30, seed=1).prompts != a.prompts
    q = generate_queries(30)
    assert set(q.task) == set(TASKS) and q.groupby("task").prompt.nunique().min() >= 25
    bools = q[q.task == "bbh_boolean_expressions"]
    assert all(str(eval(p[:-3])) == ans for p, ans in zip(bools.prompt, bools.answer))  # noqa: S307


def test_skills_follow_table2_and_costs_follow_prices():
    t = make_table(400, seed=0)
    acc = table2(t)
    target = np.array([[MODELS[m][0][TASKS.index(task)] for task in acc.columns] for m in acc.index])
    # 400 Bernoulli draws per cell: standard error <= 2.5 pp
    assert np.abs(acc.to_numpy() - target).mean() < 2.5
    assert np.abs(acc.to_numpy() - target).max() < 10
    df = t.df
    p_in = df.model.map(lambda m: MODELS[m][1]) / 1e6
    p_out = df.model.map(lambda m: MODELS[m][2]) / 1e6
    np.testing.assert_allclose(df.cost, df.input_tokens * p_in + df.output_tokens * p_out)
    means = df.groupby("model").cost.mean()
    assert means.idxmax() == "meta-llama/Llama-3.3-70B-Instruct"


def test_difficulty_matters_within_a_task():
    q = generate_queries(300, tasks=["gsm8k"])
    P = SimulatedPool().p_correct(q)
    hard = q.difficulty.to_numpy() > 0.5
    easy = q.difficulty.to_numpy() < -0.5
    assert (P[hard].mean(0) < P[easy].mean(0)).all()


def test_an_exhausted_template_space_stops_the_search_for_new_prompts(monkeypatch):
    """A task with few distinct prompts repeats some once a run of repeats shows its space exhausted, instead of
    drawing up to 50 prompts per query (10⁵ queries took 108 s; now 12 s). Sizes whose space is not exhausted
    draw exactly what they drew before (the run is never reached)."""
    import proxray.data.synthetic as S

    calls = [0]
    draw = S.GENERATORS["hellaswag"]

    def counted(rng):
        calls[0] += 1
        return draw(rng)

    monkeypatch.setitem(S.GENERATORS, "hellaswag", counted)
    df = S.generate_queries(3000, 0, tasks=["hellaswag"])
    distinct = df["prompt"].nunique()
    assert len(df) == 3000 and distinct < 3000
    assert calls[0] < 3000 + distinct * 10 + S.EXHAUSTED_AFTER  # the old search drew 150,000
    calls[0] = 0
    small = S.generate_queries(100, 0, tasks=["hellaswag"])
    assert small["prompt"].nunique() == 100 and calls[0] < 1000
