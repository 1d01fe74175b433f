"""The multi-turn task: arithmetic chains (``"3+4="`` → ``"7"``, then ``"3+4=7!7+2="`` → ``"9"``),
run by :class:`~rllm_torch.workflows.chain.ArithmeticChainWorkflow`."""

from __future__ import annotations

import random
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.tasks.base import Task, exact_match_reward
from rllm_torch.workflows.chain import ArithmeticChainWorkflow

__all__ = ["chain_problems", "chain_task"]


def chain_problems(count: int, *, turns: int, max_sum: int, seed: int, data_source: str = "chain") -> list[dict]:
    """``count`` chains of ``turns + 1`` non-negative terms whose total is at most ``max_sum``, drawn
    uniformly (with replacement) from every such tuple by ``random.Random(seed)``.

    Raises:
        ConfigError: ``turns < 1``, ``max_sum`` not in ``[0, 9]`` (answers are one digit) or ``count < 0``.

    Example:
        >>> chain_problems(1, turns=2, max_sum=9, seed=0)
        [{'prompt': '8+0=', 'answer': '8', 'terms': [8, 0, 0], 'data_source': 'chain'}]
    """
    if turns < 1 or not 0 <= max_sum <= 9 or count < 0:
        raise ConfigError(
            f"chain task: turns must be >= 1, max_sum in [0, 9] and size >= 0, got turns={turns}, max_sum={max_sum}, size={count}."
        )
    tuples: list[list[int]] = [[]]
    for _ in range(turns + 1):
        tuples = [t + [x] for t in tuples for x in range(max_sum + 1 - sum(t))]
    rng = random.Random(seed)
    chosen = (rng.choice(tuples) for _ in range(count))
    return [
        {"prompt": f"{t[0]}+{t[1]}=", "answer": str(t[0] + t[1]), "terms": t, "data_source": data_source}
        for t in chosen
    ]


def chain_task(task_config: Any) -> Task:
    """Train and validation chains from ``task_config.{train_size, val_size, max_sum, turns, seed}``
    (validation uses ``seed + 1``)."""
    turns = task_config.get("turns", 2)
    train = chain_problems(task_config.train_size, turns=turns, max_sum=task_config.max_sum, seed=task_config.seed)
    val = chain_problems(task_config.val_size, turns=turns, max_sum=task_config.max_sum, seed=task_config.seed + 1)
    return Task(
        name="chain",
        train=train,
        val=val,
        reward_fn=exact_match_reward,
        alphabet="0123456789+=!?",
        workflow=ArithmeticChainWorkflow,
        workflow_args={},
    )
