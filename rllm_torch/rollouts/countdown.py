"""Countdown (rLLM's example task): reach a target number with given numbers, each used once, and
``+ - * /``. The rows are in rLLM's format (``question``, ``ground_truth``, ``data_source``,
``target``, ``nums``) and :func:`countdown_reward_fn` scores an answer as rLLM's
``countdown_reward_fn`` does: the last ``<answer>...</answer>`` of the response must use exactly
the given numbers and evaluate to the target (reward 1); anything else scores 0.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any

from rllm_torch.rllm.types import Action
from rllm_torch.trainer.reward_threads import RewardOutput

__all__ = ["countdown_reward_fn", "countdown_rows", "evaluate_arithmetic"]

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
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


def countdown_reward_fn(task_info: dict, action: str | Action) -> RewardOutput:
    """rLLM's countdown reward: 1.0 (correct) when the response's last ``<answer>...</answer>``
    uses each of ``task_info["nums"]`` exactly once and evaluates to ``task_info["target"]``
    (within 1e-5), else 0.0 (rLLM gives a partial format score 0 too).

    Args:
        task_info: a row with ``target`` and ``nums``.
        action: the response, or an :class:`~rllm_torch.rllm.types.Action` holding it.

    Returns:
        ``RewardOutput(reward, is_correct, metadata={"validation": ...})``.
    """
    text = action.action if isinstance(action, Action) else action
    target, nums = task_info.get("target"), task_info.get("nums") or []
    if target is None or not nums:
        return RewardOutput(reward=0.0, is_correct=False, metadata={"error": "the row has no target or nums"})
    answers = _ANSWER.findall(str(text or ""))
    if not answers:
        return RewardOutput(reward=0.0, is_correct=False, metadata={"validation": "no_answer"})
    equation = answers[-1].strip()
    used = sorted(int(n) for n in re.findall(r"\d+", equation))
    result = evaluate_arithmetic(equation) if used == sorted(int(n) for n in nums) else None
    if result is not None and abs(result - float(target)) < 1e-5:
        return RewardOutput(reward=1.0, is_correct=True, metadata={"validation": "correct_solution"})
    return RewardOutput(reward=0.0, is_correct=False, metadata={"validation": "incorrect_solution"})


def countdown_rows(count: int, *, seed: int = 0, numbers: int = 3, largest: int = 9) -> list[dict[str, Any]]:
    """``count`` countdown rows in rLLM's format, each solvable: ``numbers`` integers in
    ``1..largest`` and the target of a random ``+``/``-``/``*`` expression of them (at least 1).
    The question is short (``"3 5 2 = 13?"``) so that a tiny model's context holds it."""
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
                "question": f"{' '.join(map(str, nums))} = {int(target)}?",
                "ground_truth": str(int(target)),
                "data_source": "countdown",
                "target": int(target),
                "nums": nums,
            }
        )
    return rows
