"""The countdown reward gives rLLM's result on every input: 638 seeded responses and rows scored by
rLLM's own ``countdown_reward_fn`` (rLLM main 9beb6e0f, kept in tests/data/rllm_countdown_reward.json,
made by tests/data/make_rllm_countdown_cases.py) and hand-worked cases, including the two places
where this one differs on purpose (no ``eval`` of a power tower; the global ``random`` state left alone)."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import pytest

from rllm_torch.compat.rllm import Action
from rllm_torch.compat.rllm.rewards.countdown_reward import countdown_reward_fn
from rllm_torch.rollouts.countdown_reward import evaluate_countdown_answer, extract_countdown_answer

DATA = json.loads((Path(__file__).parents[1] / "data" / "rllm_countdown_reward.json").read_text(encoding="utf-8"))
SAME_PYTHON = DATA["python"].split(".")[:2] == [str(v) for v in sys.version_info[:2]]


def test_the_reference_file_names_rllms_commit_and_holds_over_500_cases():
    assert DATA["rllm_commit"] == "9beb6e0f676a46d38858991fd79ac5f8e0b16d4c"
    assert len(DATA["cases"]) >= 500
    outcomes = {json.dumps(case["rllm"]["metadata"], sort_keys=True)[:40] for case in DATA["cases"]}
    assert len(outcomes) >= 6  # correct, partial credit, no answer, missing fields, several failures


def _differences(case: dict) -> list[str]:
    action = Action(action=case["response"]) if case["as_action"] else case["response"]
    got = countdown_reward_fn(case["task_info"], action)
    want = case["rllm"]
    found = []
    if got.reward != want["reward"] or type(got.reward).__name__ != want["reward_type"]:
        found.append(f"reward {got.reward!r}, rLLM {want['reward']!r} ({want['reward_type']})")
    if got.is_correct is not want["is_correct"]:
        found.append(f"is_correct {got.is_correct}, rLLM {want['is_correct']}")
    # Python's own exception texts change between versions: compared where the file's Python is this one
    if got.metadata.keys() != want["metadata"].keys() or (
        got.metadata != want["metadata"] and ("error" not in want["metadata"] or SAME_PYTHON)
    ):
        found.append(f"metadata {got.metadata}, rLLM {want['metadata']}")
    return found


def test_countdown_reward_equals_rllms_on_every_recorded_case():
    mismatches = [
        (case["task_info"], case["response"], found) for case in DATA["cases"] if (found := _differences(case))
    ]
    assert not mismatches, f"{len(mismatches)} of {len(DATA['cases'])} differ from rLLM, first: {mismatches[:3]}"


NUMS = {"target": 6, "nums": [1, 2, 3]}


@pytest.mark.parametrize(
    ("task_info", "response", "reward", "validation"),
    [
        (NUMS, "<answer>1 + 2 + 3</answer>", 1.0, "correct_solution"),
        (NUMS, "<answer>\n1 + 2 + 3\n</answer>", 0.0, "incorrect_solution"),  # the pattern does not cross lines
        (NUMS, "<answer>1+2+3</answer> Assistant: done", 0.0, "incorrect_solution"),  # read after "Assistant:"
        (NUMS, "Assistant: <answer>1+2+3</answer>", 1.0, "correct_solution"),
        (NUMS, "<answer>1 + 2 + 3.</answer>", 1.0, "correct_solution"),  # "3." is the float 3.0
        (NUMS, "<answer>1*2*3</answer> <answer>1+2+4</answer>", 0, "partial_credit"),  # the last tag counts
        (NUMS, "<answer>1+2+3 = 6</answer>", 0, "partial_credit"),  # '=' refused; "6" is a 4th number
        ({"target": 8, "nums": [2, 3]}, "<answer>2**3</answer>", 1.0, "correct_solution"),
        ({"target": 1, "nums": [3, 2]}, "<answer>3//2</answer>", 1.0, "correct_solution"),
        ({"target": 1, "nums": [3, 2]}, "<answer>3%2</answer>", 0, "partial_credit"),  # '%' refused
        ({"target": "6", "nums": [1, 2, 3]}, "<answer>1+2+3</answer>", 0, "partial_credit"),  # 6 - "6" fails
        ({"target": 6, "nums": ["1", "2", "3"]}, "<answer>1+2+3</answer>", 0, "partial_credit"),  # [1,2,3] != ["1",...]
        ({"target": 6.0, "nums": [1.0, 2.0, 3.0]}, "<answer>3+2+1</answer>", 1.0, "correct_solution"),  # 1 == 1.0
        ({"target": 2.5, "nums": [5, 2]}, "<answer>5/2</answer>", 1.0, "correct_solution"),
    ],
)
def test_countdown_reward_hand_worked_cases(task_info, response, reward, validation):
    got = countdown_reward_fn(task_info, response)
    assert (got.reward, type(got.reward), got.metadata) == (reward, type(reward), {"validation": validation})
    assert got.is_correct is (reward == 1.0)


def test_rows_without_target_or_nums_and_responses_that_are_not_text_give_rllms_error_outputs():
    assert countdown_reward_fn({"target": 6, "nums": []}, "x").metadata == {"error": "Missing target or nums"}
    assert countdown_reward_fn({"nums": [1]}, "x").metadata == {"error": "Missing target or nums"}
    for row, response in [(None, "<answer>1</answer>"), (NUMS, None), (NUMS, ["<answer>1+2+3</answer>"])]:
        got = countdown_reward_fn(row, response)
        assert (got.reward, got.is_correct, list(got.metadata)) == (0.0, False, ["error"])


def test_an_action_is_read_for_its_text():
    assert countdown_reward_fn(NUMS, Action(action="<answer>(1+2)*3-3</answer>")).reward == 0  # 3 used twice
    assert countdown_reward_fn(NUMS, Action(action="<answer>(1+2)*(3-1)</answer>")).reward == 0  # 1 twice
    assert countdown_reward_fn(NUMS, Action(action="<answer>(3-1)*2+1-1</answer>")).reward == 0
    assert countdown_reward_fn(NUMS, Action(action="<answer>(3-2+1)*3</answer>")).reward == 0  # four numbers
    assert countdown_reward_fn(NUMS, Action(action="<answer>3*2*1</answer>")).reward == 1.0


@pytest.mark.parametrize(
    ("answer", "value"),
    [
        ("2**3", 8),
        ("7//2", 3),
        ("-7//2", -4),
        ("1/2", 0.5),
        ("2.5*2", 5.0),
        (".5+1.", 1.5),
        ("2**-1", 0.5),
        ("(((1)))", 1),
        ("1 - -2", 3),
        ("1/0", None),
        ("3%2", None),
        ("()", None),
        ("...", None),
        ("(1)(2)", None),
        ("1 2", None),
        ("012", None),
        ("\uff11+\uff12", None),
        ("1\u00a0+2", None),
        ("x", None),
        ("", None),
    ],
)
def test_answers_evaluate_to_the_values_python_gives(answer, value):
    got = evaluate_countdown_answer(answer)
    assert got == value and type(got) is type(value)


def test_a_negative_base_to_a_fractional_power_is_the_complex_number_python_gives():
    assert evaluate_countdown_answer("(0-4)**0.5") == pytest.approx(2j)
    # |(-4)**0.5 - 2| = |2j - 2| = 2.83 > 1e-5: rLLM's abs() takes the complex number's modulus
    assert countdown_reward_fn({"target": 2, "nums": [0, 4, 0, 5]}, "<answer>(0-4)**0.5</answer>").reward == 0


def test_the_answer_is_the_last_one_line_tag_after_the_first_assistant_marker():
    assert extract_countdown_answer("<answer>1</answer> Assistant: <answer> 2 </answer><answer>3</answer>") == "3"
    assert extract_countdown_answer("<answer>1</answer><|im_start|>assistant <answer>2</answer>") == "2"
    assert extract_countdown_answer("<answer>1</answer><|im_start|>assistant") is None
    assert extract_countdown_answer("<answer>1\r+2</answer>") == "1\r+2"  # only '\n' ends the match
    assert extract_countdown_answer("<answer>\n1</answer>") is None


def test_a_power_tower_is_refused_in_milliseconds_where_rllms_eval_would_run_for_hours():
    start = time.perf_counter()
    got = countdown_reward_fn({"target": 1, "nums": [9] * 6}, "<answer>(9**9**9)//(9**9**9)</answer>")
    assert time.perf_counter() - start < 1.0
    assert (got.reward, got.metadata) == (0, {"validation": "partial_credit"})
    assert evaluate_countdown_answer("2**4194304") == 2**4194304  # MAX_INT_BITS itself is computed
    assert evaluate_countdown_answer("2**4194305") is None


def test_the_global_random_state_is_left_alone():
    random.seed(7)
    expected = random.random()
    random.seed(7)
    countdown_reward_fn(NUMS, "<answer>1+2+3</answer>")
    assert random.random() == expected
