"""rLLM's ``rllm.rewards`` names beyond countdown, with rLLM's meaning: ``f1_reward_fn`` and
``zero_reward`` equal to rLLM's on 605 seeded cases scored by rLLM's own code (rLLM main 9beb6e0f,
tests/data/rllm_f1_reward.json, made by tests/data/make_rllm_f1_cases.py), the ``RewardFunction``
protocol the solver-judge cookbook imports, rLLM's reward types, and the one-line ``ImportError``
for the rewards that need rLLM's graders."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rllm_torch.compat.rllm import Action
from rllm_torch.compat.rllm.rewards import (
    RewardConfig,
    RewardFunction,
    RewardInput,
    RewardOutput,
    RewardType,
    zero_reward,
)
from rllm_torch.compat.rllm.rewards.reward_fn import f1_reward_fn
from rllm_torch.compat.rllm.rewards.reward_types import LiveCodebenchInput

DATA = json.loads((Path(__file__).parents[1] / "data" / "rllm_f1_reward.json").read_text(encoding="utf-8"))


def test_f1_and_zero_reward_equal_rllms_on_every_recorded_case():
    assert DATA["rllm_commit"] == "9beb6e0f676a46d38858991fd79ac5f8e0b16d4c" and len(DATA["cases"]) >= 500
    mismatches = []
    for case in DATA["cases"]:
        action = Action(action=case["response"]) if case["as_action"] else case["response"]
        got, zero = f1_reward_fn(case["task_info"], action), zero_reward(case["task_info"], action)
        want = case["rllm"]
        if (got.reward, got.is_correct, got.metadata) != (want["reward"], want["is_correct"], want["metadata"]):
            mismatches.append((case["task_info"], case["response"], got.reward, want["reward"]))
        if [zero.reward, zero.is_correct, zero.metadata] != want["zero_reward"]:
            mismatches.append(("zero_reward", case["response"]))
    assert not mismatches, f"{len(mismatches)} differ from rLLM, first: {mismatches[:3]}"
    assert sum(0 < case["rllm"]["reward"] < 1 for case in DATA["cases"]) >= 50  # partial overlaps are covered


@pytest.mark.parametrize(
    ("truth", "response", "f1"),
    [
        ("Hello, world!", "hello there world", 0.8),  # P = 2/3, R = 2/2: 2·(2/3)·1 / (5/3) = 0.8
        ("The Eiffel Tower", "the eiffel tower.", 1.0),  # articles and punctuation dropped
        ("x y y", "y y y z", 4 / 7),  # common {y: 2}: P = 2/4, R = 2/3, F1 = (2/3)/(7/6) = 4/7
        ("the a an", "a", 0.0),  # both sides empty once articles go
        (None, "anything", 0.0),
        (None, "None", 0.0),  # a None truth is "", not the word "none"
    ],
)
def test_f1_hand_worked(truth, response, f1):
    assert f1_reward_fn({"ground_truth": truth}, response).reward == pytest.approx(f1, abs=1e-15)


def test_any_callable_is_a_reward_function_as_in_rllm():
    assert isinstance(zero_reward, RewardFunction) and isinstance(f1_reward_fn, RewardFunction)
    assert isinstance(lambda task_info, action: 1.0, RewardFunction)
    assert not isinstance("not callable", RewardFunction)


def test_reward_types_have_rllms_fields_and_defaults():
    assert {f.name: f.default for f in dataclasses.fields(RewardConfig)} == {
        "apply_format_reward": False, "math_reward_weight": 1.0, "use_math_orm": False, "code_reward_weight": 1.0,
        "cot_reward_weight": 0.0, "correct_reward": 1.0, "incorrect_reward": 0.0, "format_error_reward": 0.0,
        "unk_error_reward": 0.0, "toolcall_bonus": 0.5, "use_together_code_interpreter": False,
    }  # fmt: skip
    assert [t.value for t in RewardType] == ["MATH", "CODE", "WEB", "UNK"]
    assert RewardInput(task_info={"q": 1}, action="a").action == "a"
    with pytest.raises(TypeError):
        RewardInput({"q": 1}, "a")  # keyword-only, as rLLM's
    code = LiveCodebenchInput(question="q", generation_code="c", problem={})
    assert (code.problem_type, code.difficult) == (RewardType.CODE, "easy")
    assert RewardOutput(reward=1.0).is_correct is None and RewardOutput(reward=1.0).metadata == {}


@pytest.mark.parametrize("name", ["math_reward_fn", "code_reward_fn", "search_reward_fn", "RewardMathFn"])
def test_rewards_that_need_rllms_graders_fail_to_import_with_one_line_saying_what_to_use(name):
    with pytest.raises(ImportError, match=rf"rLLM's {name} .* not mirrored.*reward_function\(task_info, action\)"):
        exec(f"from rllm_torch.compat.rllm.rewards.reward_fn import {name}", {})
