"""The default task: single-digit addition with a one-token answer (``"3+4="`` → ``"7"``),
scored by exact match. Small enough that a tiny model learns it by RL alone in minutes on CPU.
Two reward functions, ``correct`` (exact match, the reward) and ``format`` (the answer is one
digit), are also scored separately, for multi-objective estimators (``gdpo``)."""

from __future__ import annotations

import random
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.task import Task, exact_match_reward, seeded_splits

__all__ = ["arithmetic_problems", "arithmetic_task", "one_digit_format_reward"]


def arithmetic_problems(count: int, *, max_sum: int, seed: int, data_source: str = "arithmetic") -> list[dict]:
    """``count`` problems ``a+b=`` with digits ``a, b >= 0`` and ``a + b <= max_sum``, drawn
    uniformly (with replacement) from every such pair by ``random.Random(seed)``: the same seed
    gives the same list.

    Raises:
        ConfigError: ``max_sum`` not in ``[0, 9]`` (the answer must be one digit) or ``count < 0``.

    Examples:
        >>> arithmetic_problems(2, max_sum=9, seed=0)[0]
        {'prompt': '9+0=', 'answer': '9', 'data_source': 'arithmetic'}
    """
    if not 0 <= max_sum <= 9 or count < 0:
        raise ConfigError(
            f"arithmetic task: max_sum must be in [0, 9] and size >= 0, got max_sum={max_sum}, size={count}."
        )
    pairs = [(a, b) for a in range(10) for b in range(10) if a + b <= max_sum]
    rng = random.Random(seed)
    return [
        {"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": data_source}
        for a, b in (rng.choice(pairs) for _ in range(count))
    ]


def one_digit_format_reward(task: dict, response: str) -> float:
    """1.0 when the response, stripped, is a single digit (the form of every answer), else 0.0.

    Examples:
        >>> one_digit_format_reward({"answer": "7"}, "3"), one_digit_format_reward({"answer": "7"}, "3+")
        (1.0, 0.0)
    """
    text = response.strip()
    return 1.0 if len(text) == 1 and text.isdigit() else 0.0


def arithmetic_task(task_config: Any) -> Task:
    """Train and validation splits from ``task_config.{train_size, val_size, max_sum, seed}``
    (validation uses ``seed + 1``, so the splits are independent draws of the same problems)."""
    train, val = seeded_splits(arithmetic_problems, task_config, max_sum=task_config.max_sum)
    return Task(
        name="arithmetic",
        train=train,
        val=val,
        reward_fn=exact_match_reward,
        alphabet="0123456789+=",
        answer_in_response=True,
        reward_components={"correct": exact_match_reward, "format": one_digit_format_reward},
    )
