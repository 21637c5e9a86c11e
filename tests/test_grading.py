import pytest

from proxray.evaljob.grading import extract_choice, extract_number, grade


@pytest.mark.parametrize("text,value", [
    ("The answer is 42.", 42), ("#### 1,234", 1234), ("So she has 5 apples left. Final answer: **17**", 17),
    ("\\boxed{3.5}", 3.5), ("First 3 + 4 = 7, then 7 * 2 = 14", 14), ("Answer: -8", -8),
    ("The answer is $1,200.", 1200), ("1/2 of them, i.e. the answer is 3/4", 0.75), ("no digits here", None),
])
def test_extract_number(text, value):
    assert extract_number(text) == value


@pytest.mark.parametrize("text,letter", [
    ("(B)", "B"), ("The answer is (C) because ...", "C"), ("Answer: d", "D"), ("B) Patricia", "B"),
    ("**A**", "A"), ("I think option E is right", "E"), ("A", "A"), ("The correct choice: (b) summer", "B"),
    ("None of these", None),
])
def test_extract_choice(text, letter):
    assert extract_choice(text) == letter


def test_grade():
    assert grade("The answer is 27.", "27", "number") == 1.0
    assert grade("The answer is 28.", "27", "number") == 0.0
    assert grade("(B)", "B", "choice") == 1.0 and grade("(A)", "(B)", "choice") == 0.0
    assert grade("True", "True", "exact") == 1.0 and grade("False", "True", "exact") == 0.0
    assert grade("It is True.", "True", "exact") == 1.0
    with pytest.raises(ValueError, match="answer_type='essay'"):
        grade("x", "y", "essay")


@pytest.mark.parametrize("text,score", [
    ("Score: 1", 1.0), ("score: 0.25", 0.25), ("The answer is wrong. Score: 0", 0.0), ("**Score:** 0.5", 0.5),
    ("Score: 7/10", 0.7), ("0.8", 0.8), ("Score: 3", None), ("I think it is fine.", None), ("", None), (None, None),
    ("Score: 1\nActually, Score: 0", 0.0),
])
def test_parse_judge_score(text, score):
    from proxray.evaljob.grading import parse_score

    assert parse_score(text) == score
