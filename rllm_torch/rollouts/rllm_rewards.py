"""rLLM's reward types and its small reward functions (``rllm.rewards.reward_types`` and
``rllm.rewards.reward_fn``), with rLLM's meaning: :class:`RewardFunction` (the protocol a
workflow's ``reward_function`` follows), :func:`zero_reward`, :func:`f1_reward_fn` (rLLM's
SQuAD-style token F1, equal to rLLM's on the generated cases in tests/data/rllm_f1_reward.json),
:class:`RewardConfig`, :class:`RewardType`, :class:`RewardInput` and :class:`LiveCodebenchInput`.
Read from rLLM main 9beb6e0f (2026-08-15).

rLLM's ``math_reward_fn``, ``code_reward_fn`` and ``search_reward_fn`` need rLLM's math grader,
code sandboxes and search tools and are not here (importing them says so).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol, runtime_checkable

from rllm_torch.rllm.types import Action
from rllm_torch.trainer.reward_threads import RewardOutput

__all__ = [
    "RewardFunction",
    "zero_reward",
    "f1_reward_fn",
    "RewardConfig",
    "RewardType",
    "RewardInput",
    "LiveCodebenchInput",
]


@runtime_checkable
class RewardFunction(Protocol):
    """What a reward function is (rLLM's ``rllm.rewards.reward_fn.RewardFunction``): a callable
    ``fn(task_info, action) -> RewardOutput``; ``task_info`` is the task's row, ``action`` the
    response. Any callable passes ``isinstance(fn, RewardFunction)``, as in rLLM (a runtime
    protocol checks only that ``__call__`` exists). rllm_torch's workflows also take a float or
    bool where a :class:`RewardOutput` is expected."""

    def __call__(self, task_info: dict, action: str) -> RewardOutput: ...


def zero_reward(task_info: dict, action: str) -> RewardOutput:
    """rLLM's placeholder reward: ``RewardOutput(reward=0.0, metadata={})`` for any input."""
    return RewardOutput(reward=0.0, metadata={})


_ARTICLE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def _normalized_tokens(text: str) -> list[str]:
    """Lower-cased, ASCII punctuation removed, then the articles a/an/the, split on whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return _ARTICLE.sub(" ", text).split()


def f1_reward_fn(task_info: dict, action: Any) -> RewardOutput:
    """rLLM's token F1 between the response and ``task_info["ground_truth"]`` (HotpotQA/SQuAD
    normalisation: lower case, ASCII punctuation and the articles a/an/the removed, split on
    whitespace).

    ``F1 = 2PR / (P + R)`` with ``P = common / len(response tokens)`` and
    ``R = common / len(truth tokens)``, ``common`` the size of the two token multisets'
    intersection; 0.0 when either side has no tokens or nothing is shared.

    Args:
        task_info: the row; a missing or None ``ground_truth`` counts as ``""``. Anything
            else is read with ``str()``, as is the response.
        action: the response, or an :class:`~rllm_torch.rllm.types.Action` holding it.

    Returns:
        ``RewardOutput(reward=F1, metadata={})`` (``is_correct`` None, as rLLM leaves it).

    Raises:
        AttributeError: ``task_info`` has no ``get`` (rLLM's function raises it too).
    """
    if isinstance(action, Action):
        action = action.action
    truth = task_info.get("ground_truth", "")
    predicted, gold = _normalized_tokens(str(action)), _normalized_tokens(str("" if truth is None else truth))
    common = sum((Counter(predicted) & Counter(gold)).values())
    if not predicted or not gold or common == 0:
        return RewardOutput(reward=0.0, metadata={})
    precision, recall = common / len(predicted), common / len(gold)
    return RewardOutput(reward=(2 * precision * recall) / (precision + recall), metadata={})


@dataclass
class RewardConfig:
    """rLLM's reward settings (``rllm.rewards.reward_types.RewardConfig``), same fields and
    defaults; read by rLLM's math, code and search rewards, which are not here."""

    apply_format_reward: bool = False
    math_reward_weight: float = 1.0
    use_math_orm: bool = False
    code_reward_weight: float = 1.0
    cot_reward_weight: float = 0.0
    correct_reward: float = 1.0
    incorrect_reward: float = 0.0
    format_error_reward: float = 0.0
    unk_error_reward: float = 0.0
    toolcall_bonus: float = 0.5
    use_together_code_interpreter: bool = False


class RewardType(Enum):
    """rLLM's problem types (``rllm.rewards.reward_types.RewardType``)."""

    MATH = "MATH"
    CODE = "CODE"
    WEB = "WEB"
    UNK = "UNK"


@dataclass(slots=True, kw_only=True)
class RewardInput:
    """rLLM's ``RewardInput``: a task's row (``task_info``) and the response (``action``)."""

    task_info: dict
    action: str


@dataclass(slots=True, kw_only=True)
class LiveCodebenchInput:
    """rLLM's ``LiveCodebenchInput`` (the input of its LiveCodeBench code reward), same fields."""

    problem_type: RewardType = RewardType.CODE
    question: str
    generation_code: str
    problem: dict
    difficult: str = "easy"
