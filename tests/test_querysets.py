import pandas as pd
import pytest

from proxray.evaljob.grading import grade
from proxray.data.querysets import HF_TASKS, hf_queries, read_queries, validate_queries

# One row per task in the layout its Hugging Face data set has.
HF_ROWS = {
    "svamp": {"Body": "Jack had 8 pens.", "Question": "He gave away 3. How many are left?", "Answer": 5.0},
    "gsm8k": {"question": "Tom has 3 boxes of 4 eggs. How many eggs?", "answer": "3*4=12\n#### 12"},
    "hellaswag": {"ctx": "A man mows the lawn.", "endings": ["he flies", "he stops", "he sings", "he melts"], "label": "1"},
    "sciq": {"question": "What gas do plants absorb?", "correct_answer": "carbon dioxide", "distractor1": "oxygen",
             "distractor2": "helium", "distractor3": "neon", "support": ""},
    "social_iqa": {"context": "Skylar got the job.", "question": "How would you describe Skylar?", "answerA": "sad",
                   "answerB": "hired", "answerC": "lost", "label": "2"},
    "winogrande": {"sentence": "Megan asked Patricia because _ was busy.", "option1": "Megan", "option2": "Patricia", "answer": "1"},
    "medqa": {"question": "Chest pain with ST elevation?", "options": {"A": "MI", "B": "flu", "C": "gout", "D": "cold"}, "answer_idx": "A"},
    "commonsense_qa": {"question": "Where is milk kept cold?", "choices": {"label": list("ABCDE"), "text": ["fridge", "oven", "car", "sun", "desk"]}, "answerKey": "A"},
    "logiqa": {"context": "A walks, B runs.", "query": "Who is first?", "options": ["A", "B", "same", "unknown"], "correct_option": 1},
    "bbh_boolean_expressions": {"input": "not ( True ) and ( True ) is", "target": "False"},
}


@pytest.mark.parametrize("task", sorted(HF_TASKS))
def test_hf_tasks_use_the_paper_prompts(task):
    calls = []

    def load_dataset(name, *args, split=None):
        calls.append((name, args, split))
        return [HF_ROWS[task]] * 3

    q = hf_queries(task, load_dataset=load_dataset, n=2)
    assert calls[0][0] == HF_TASKS[task][0] and len(q) == 2
    p, a, kind = q.prompt[0], q.answer[0], q.answer_type[0]
    assert p.rstrip().endswith(("Answer:", "without any explanation:"))
    if kind == "number":
        assert "Solve the following math problem" in p and grade(f"The answer is {a}", a, kind) == 1.0
    else:
        assert "(A)" in p and grade(f"({a})", a, kind) == 1.0
    expected = {"svamp": "5.0", "gsm8k": "12", "hellaswag": "B", "social_iqa": "B", "winogrande": "A",
                "medqa": "A", "commonsense_qa": "A", "logiqa": "B", "bbh_boolean_expressions": "B"}
    if task in expected:
        assert a == expected[task]
    if task == "sciq":  # options are shuffled: the key points at the right text
        assert f"({a}) carbon dioxide" in p


def test_local_query_files(tmp_path):
    df = pd.DataFrame({"query_id": ["a", "b"], "task": ["t", "t"], "prompt": ["p1", "p2"], "answer": ["1", "B"],
                       "answer_type": ["number", "choice"]})
    df.to_json(tmp_path / "q.jsonl", orient="records", lines=True)
    df.to_parquet(tmp_path / "q.parquet")
    assert read_queries(tmp_path / "q.jsonl").equals(read_queries(tmp_path / "q.parquet"))
    with pytest.raises(ValueError, match="column 'answer_type' is 'essay' at row 1"):
        validate_queries(df.assign(answer_type=["number", "essay"]))
    with pytest.raises(ValueError, match="column 'query_id' repeats 'a' at row 1"):
        validate_queries(df.assign(query_id=["a", "a"]))
    with pytest.raises(ValueError, match="missing column"):
        validate_queries(df.drop(columns=["answer"]))
