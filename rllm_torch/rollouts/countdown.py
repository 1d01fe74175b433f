"""Countdown (rLLM's example task): reach a target number with given numbers, each used once, and
``+ - * /``. The rows are in rLLM's format (``question``, ``ground_truth``, ``data_source``,
``target``, ``nums``); :func:`countdown_reward_fn` (from
:mod:`~rllm_torch.rollouts.countdown_reward`) scores an answer as rLLM's ``countdown_reward_fn``
does, with rLLM's result on every input.
"""

from __future__ import annotations

import ast
import operator
import random
from typing import Any

from rllm_torch.rollouts.countdown_reward import countdown_reward_fn

__all__ = ["countdown_reward_fn", "countdown_rows", "evaluate_arithmetic"]

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def evaluate_arithmetic(expression: str) -> float | None:
    """The value of an expression of integers, ``+ - * /``, unary minus and parentheses; None for
    anything else (names, calls, powers, a division by zero, a syntax error). Never ``eval``."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = value(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        raise ValueError(f"not arithmetic: {ast.dump(node)}")

    try:
        return value(ast.parse(expression.strip(), mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None


def countdown_rows(
    count: int, *, seed: int = 0, numbers: int = 3, largest: int = 9, rllm_question: bool = False
) -> list[dict[str, Any]]:
    """``count`` countdown rows in rLLM's format, each solvable: ``numbers`` integers in
    ``1..largest`` and the target of a random ``+``/``-``/``*`` expression of them (at least 1).
    The question is short (``"3 5 2 = 13?"``) so that a tiny model's context holds it; with
    ``rllm_question``, it is the text rLLM's ``examples/countdown/prepare_countdown_data.py`` writes
    (about 300 characters: a tiny model needs ``model.max_positions`` to hold it)."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        nums = [rng.randint(1, largest) for _ in range(numbers)]
        expression = str(nums[0])
        for n in nums[1:]:
            expression = f"({expression} {rng.choice('+-*')} {n})"
        target = evaluate_arithmetic(expression)
        if target is None or target < 1:
            continue
        rows.append(
            {
                "question": _rllm_question(nums, int(target))
                if rllm_question
                else f"{' '.join(map(str, nums))} = {int(target)}?",
                "ground_truth": str(int(target)),
                "data_source": "countdown",
                "target": int(target),
                "nums": nums,
            }
        )
    return rows


def _rllm_question(nums: list[int], target: int) -> str:
    """rLLM's countdown question (``examples/countdown/prepare_countdown_data.py``'s ``preprocess_fn``)."""
    return (
        f"Using the numbers {', '.join(map(str, nums))}, find a way to reach the target number {target}. You can use "
        "basic arithmetic operations (+, -, *, /) and each number can only be used once. Show your step-by-step "
        "calculation and output the final answer within <answer>...</answer>, for example <answer> (1 + 2) / 3 "
        "</answer>."
    )
