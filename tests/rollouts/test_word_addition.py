"""The word-addition task for pretrained chat models and its answer-parsing reward, by hand."""

from __future__ import annotations

import pytest

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.word_addition import extract_final_number, final_number_reward, word_addition_problems


@pytest.mark.parametrize(
    "response, number",
    [
        ("109", "109"),
        ("27 + 82 = 109.", "109"),  # the last number, not the operands
        ("The answer is 1,234", "1234"),  # thousands separators
        ("It is 109.0", "109"),  # a float's .0
        ("-5 is negative", "-5"),
        (r"\boxed{109} (27 + 82)", "109"),  # \boxed wins over a later number
        (r"\boxed{1} then \boxed{ 2 }", "2"),  # the last box
        ("#### 109\nso 27 + 82", "109"),  # GSM8K's marker wins over a later number
        (r"#### 5 and \boxed{7}", "7"),  # a box wins over the marker
        ("no number at all", None),
        ("", None),
    ],
)
def test_the_final_number_is_read_as_gsm8k_graders_read_it(response, number):
    assert extract_final_number(response) == number


def test_the_reward_is_one_exactly_when_the_final_number_is_the_sum():
    task = {"answer": "109"}
    assert [final_number_reward(task, r) for r in ("109", "1090", "10 9", "108 or 109", "109 or 108")] == [
        1.0,
        0.0,
        0.0,
        1.0,
        0.0,
    ]


def test_problems_have_operands_of_the_asked_digit_counts_and_their_sums():
    rows = word_addition_problems(200, min_digits=2, max_digits=3, seed=5)
    assert rows == word_addition_problems(200, min_digits=2, max_digits=3, seed=5)  # the seed decides
    for row in rows:
        a, b = row["prompt"].removeprefix("What is ").split("?")[0].split(" + ")
        assert 2 <= len(a) <= 3 and 2 <= len(b) <= 3 and not a.startswith("0") and not b.startswith("0")
        assert row["answer"] == str(int(a) + int(b))
        assert row["prompt"].endswith("? Answer with the number only.")
    assert {len(row["answer"]) for row in rows} >= {2, 3, 4}
    with pytest.raises(ConfigError, match="need 1 <= task.min_digits <= task.max_digits"):
        word_addition_problems(1, min_digits=3, max_digits=2, seed=0)
