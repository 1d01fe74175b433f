"""rLLM's countdown reward (``rllm.rewards.countdown_reward.countdown_reward_fn``), giving rLLM's
result on every input, without ``eval``.

What rLLM's function does, step by step (read from rLLM main 9beb6e0f, 2026-08-15, and checked
against values its code gives on 638 generated inputs in ``tests/data/rllm_countdown_reward.json``):

1. An :class:`~rllm_torch.rllm.types.Action` is unwrapped to its ``action``.
2. ``task_info["target"]`` missing or None, or ``task_info["nums"]`` missing or empty (falsy):
   reward 0.0, ``metadata={"error": "Missing target or nums"}``.
3. The response is cut after its first ``"Assistant:"`` (else after its first
   ``"<|im_start|>assistant"``), and the answer is the last ``<answer>...</answer>`` of what is
   left, stripped. ``.`` does not cross lines: an answer spanning lines is not an answer.
   No answer: reward 0.0, ``"incorrect_solution"``.
4. The answer's runs of digits (``\\d+``: Unicode digits too) must be the numbers of
   ``nums``, sorted, compared with ``==`` (so ``[1.0, 2.0]`` matches ``1+2``; ``["1", "2"]`` never does).
5. The answer must consist of digits, ``+ - * / ( ) .`` and whitespace only, parse as a Python
   expression and evaluate (``**`` and ``//`` included; ``%`` is refused by the character check),
   and ``abs(value - target) < 1e-5`` must hold (a string target never does).
6. 1.0 and ``"correct_solution"`` when all hold; else reward ``0`` (an ``int``, as rLLM returns it)
   and ``"partial_credit"``; an exception anywhere (a row that is not a dict, a response that is
   not a string) gives reward 0.0 and ``metadata={"error": str(exception)}``.

Where this differs from rLLM's function, on purpose:

* rLLM evaluates the answer with ``eval``; here it is parsed with :func:`ast.parse` (the parser
  ``eval`` uses, so the same strings are accepted) and the tree is evaluated with Python's own
  operators, so every value is the one ``eval`` gives. An integer result beyond
  :data:`MAX_INT_BITS` bits (``9**9**9``, which keeps ``eval`` busy for minutes to hours) is not
  computed: that answer scores as one that does not evaluate (reward 0, ``"partial_credit"``).
* rLLM draws ``random.randint(1, 64)`` from the global ``random`` module on each scored
  response, to log one in 64 at debug level; this function leaves the global ``random`` state alone
  and logs nothing.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any

from rllm_torch.rllm.types import Action
from rllm_torch.trainer.reward_threads import RewardOutput

__all__ = ["countdown_reward_fn", "extract_countdown_answer", "evaluate_countdown_answer", "MAX_INT_BITS"]

MAX_INT_BITS = 1 << 22
"""The largest integer (in bits, about 1.26 million decimal digits) an answer may compute on its
way; a larger one makes the answer score as one that does not evaluate."""

_ANSWER = re.compile(r"<answer>(.*?)</answer>")  # no re.DOTALL, as rLLM's
_ANSWER_CHARACTERS = re.compile(r"^[\d+\-*/().\s]+$")
_DIGIT_RUN = re.compile(r"\d+")
_FORMAT_ONLY = 0.1  # rLLM's score for an answer in the format that is not the solution


class _NotANumber(Exception):
    """The answer's value is not a number here (a tuple, ``...``, a call, an integer too large)."""


def extract_countdown_answer(response: Any) -> str | None:
    """The answer rLLM reads from a countdown response: the last ``<answer>...</answer>`` on one
    line, stripped, after the first ``"Assistant:"`` (else ``"<|im_start|>assistant"``) if any.

    Args:
        response: the response text.

    Returns:
        The answer, or None when there is none.

    Raises:
        TypeError, AttributeError: ``response`` is not a string (what rLLM's code raises for it).
    """
    for marker in ("Assistant:", "<|im_start|>assistant"):
        if marker in response:
            response = response.split(marker, 1)[1]
            break
    answers = _ANSWER.findall(response)
    return answers[-1].strip() if answers else None


def _uses_exactly(answer: str, nums: Any) -> bool:
    """Whether the answer's digit runs, as integers, sorted, equal ``sorted(nums)``."""
    try:
        return sorted(int(run) for run in _DIGIT_RUN.findall(answer)) == sorted(nums)
    except Exception:  # rLLM's rule: any failure here (mixed types, a 5000-digit run) means "not these numbers"
        return False


def _power(base: Any, exponent: Any) -> Any:
    if type(base) is int and type(exponent) is int and exponent > 0 and abs(base) > 1:
        if exponent * (abs(base).bit_length() - 1) > MAX_INT_BITS:
            raise _NotANumber(f"{base}**{exponent} has more than {MAX_INT_BITS} bits")
    return base**exponent


def _times(left: Any, right: Any) -> Any:
    if type(left) is int and type(right) is int and left.bit_length() + right.bit_length() - 1 > MAX_INT_BITS:
        raise _NotANumber(f"a product of more than {MAX_INT_BITS} bits")
    return left * right


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: _times,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: _power,
}


def _evaluate(tree: ast.expr) -> Any:
    """The tree's value with Python's operators, walked with a stack (no recursion limit)."""
    pending: list[tuple[ast.expr, bool]] = [(tree, False)]
    values: list[Any] = []
    while pending:
        node, operands_done = pending.pop()
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            values.append(node.value)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            if operands_done:
                values.append(-values.pop() if isinstance(node.op, ast.USub) else +values.pop())
            else:
                pending += [(node, True), (node.operand, False)]
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            if operands_done:
                right = values.pop()
                values.append(_BINARY[type(node.op)](values.pop(), right))
            else:
                pending += [(node, True), (node.right, False), (node.left, False)]
        else:  # (), ..., a call: eval gives a tuple, Ellipsis or a TypeError, never a number
            raise _NotANumber(type(node).__name__)
    return values.pop()


def evaluate_countdown_answer(answer: str) -> int | float | complex | None:
    """The number rLLM's ``eval`` gives for a countdown answer, or None where it gives none.

    Only digits, ``+ - * / ( ) .`` and whitespace are accepted (as rLLM's check); the text is
    parsed by :func:`ast.parse` and evaluated with Python's operators, so ``2**3``, ``7//2``,
    ``1/2``, ``2.5*2`` and ``(-8)**0.5`` (a complex number) are the values ``eval`` gives.

    Returns:
        The value; None for a refused character, a syntax error, a division by zero, an
        overflow, a value that is not a number, or an integer beyond :data:`MAX_INT_BITS` bits.
    """
    if not _ANSWER_CHARACTERS.match(answer):
        return None
    try:
        return _evaluate(ast.parse(answer, mode="eval").body)
    except (SyntaxError, ValueError, TypeError, ArithmeticError, RecursionError, MemoryError, _NotANumber):
        return None


def _score(response: Any, target: Any, nums: Any) -> float:
    """rLLM's ``compute_score``: 0 without an answer, 1.0 for the solution, 0.1 otherwise."""
    answer = extract_countdown_answer(response)
    if answer is None:
        return 0
    if not _uses_exactly(answer, nums):
        return _FORMAT_ONLY
    value = evaluate_countdown_answer(answer)
    try:
        return 1.0 if value is not None and abs(value - target) < 1e-5 else _FORMAT_ONLY
    except Exception:  # rLLM's rule: a target that does not subtract (a string) scores as a wrong answer
        return _FORMAT_ONLY


def countdown_reward_fn(task_info: dict, action: str | Action) -> RewardOutput:
    """rLLM's countdown reward, with rLLM's result on every input (the module docstring has the
    rules and the two deliberate differences).

    Args:
        task_info: a row with ``target`` and ``nums``.
        action: the response, or an :class:`~rllm_torch.rllm.types.Action` holding it.

    Returns:
        ``RewardOutput(1.0, is_correct=True, metadata={"validation": "correct_solution"})`` for a
        solution; reward ``0`` with ``"partial_credit"`` for an answer that is not one; 0.0 with
        ``"incorrect_solution"`` without an answer; 0.0 with ``{"error": ...}`` for a row without
        target or nums, or an input rLLM's code fails on (the failure's text). Never raises.
    """
    try:
        if isinstance(action, Action):
            action = action.action
        target = task_info.get("target")
        nums = task_info.get("nums", [])
        if target is None or not nums:
            return RewardOutput(reward=0.0, is_correct=False, metadata={"error": "Missing target or nums"})
        score = _score(action, target, nums)
        if score >= 1.0:
            return RewardOutput(reward=1.0, is_correct=True, metadata={"validation": "correct_solution"})
        if score > 0.0:
            return RewardOutput(reward=0, is_correct=False, metadata={"validation": "partial_credit"})
        return RewardOutput(reward=0.0, is_correct=False, metadata={"validation": "incorrect_solution"})
    except Exception as error:  # rLLM's contract: a reward function never raises; the text goes to metadata
        return RewardOutput(reward=0.0, is_correct=False, metadata={"error": str(error)})
