"""A task with longer answers: reverse a string of digits, answered in full (``"40721="`` →
``"12704"``), with partial credit for each right position. Responses run to ``max_digits + 1``
tokens (the answer and the end token), where the default task's are two, so response length and
the loss aggregation mode matter."""

from __future__ import annotations

import random
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.task import Task, seeded_splits

__all__ = ["reverse_problems", "reverse_task", "positional_match_reward"]


def reverse_problems(
    count: int, *, min_digits: int, max_digits: int, seed: int, data_source: str = "reverse"
) -> list[dict]:
    """``count`` problems ``"<digits>="`` with answer the digits reversed; the length is uniform
    in ``[min_digits, max_digits]`` and each digit uniform in 0-9, drawn by ``random.Random(seed)``.

    Raises:
        ConfigError: ``min_digits < 1``, ``max_digits < min_digits`` or ``count < 0``.

    Examples:
        >>> reverse_problems(1, min_digits=3, max_digits=5, seed=0)
        [{'prompt': '6048=', 'answer': '8406', 'data_source': 'reverse'}]
    """
    if not 1 <= min_digits <= max_digits or count < 0:
        raise ConfigError(
            f"reverse task: need 1 <= task.min_digits <= task.max_digits and a size >= 0, got task.min_digits={min_digits}, "
            f"task.max_digits={max_digits}, size {count}; e.g. task.min_digits={min(max(min_digits, 1), max(max_digits, 1))} "
            f"task.max_digits={max(max_digits, 1)}."
        )
    rng = random.Random(seed)
    problems = []
    for _ in range(count):
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(min_digits, max_digits)))
        problems.append({"prompt": f"{digits}=", "answer": digits[::-1], "data_source": data_source})
    return problems


def positional_match_reward(task: dict, response: str) -> float:
    """The share of positions where the response (stripped of surrounding whitespace) has the
    answer's character, over the longer of the two: 1.0 only for an exact match, and a response
    that is too long or too short loses the positions it lacks or adds.

    Examples:
        >>> [positional_match_reward({"answer": "1234"}, r) for r in ("1234", "1294", "12", "123456")]
        [1.0, 0.75, 0.5, 0.6666666666666666]
    """
    answer, response = str(task["answer"]).strip(), response.strip()
    longest = max(len(answer), len(response))
    if longest == 0:
        return 1.0
    return sum(a == b for a, b in zip(answer, response, strict=False)) / longest


def reverse_task(task_config: Any) -> Task:
    """Train and validation splits from ``task_config.{train_size, val_size, min_digits,
    max_digits, seed}`` (validation uses ``seed + 1``); reward :func:`positional_match_reward`,
    correct on an exact match."""
    lengths = dict(min_digits=task_config.min_digits, max_digits=task_config.max_digits)
    train, val = seeded_splits(reverse_problems, task_config, **lengths)
    return Task(
        name="reverse",
        train=train,
        val=val,
        reward_fn=positional_match_reward,
        alphabet="0123456789=",
        answer_in_response=True,
    )
