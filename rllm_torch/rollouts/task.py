"""The task interface: datasets of prompt/answer dicts plus a reward function. Each task module
builds a :class:`Task` from its config section; :mod:`rllm_torch.rollouts.catalog` picks one by name."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.single_turn import RewardFn

__all__ = ["Task", "seeded_splits", "exact_match_reward", "alphabet_of", "EnvironmentLatency"]


class EnvironmentLatency:
    """The wait of an environment's reply (a tool call, a sandbox, a slow judge): each
    :meth:`wait` sleeps a uniform ``[low, high]`` milliseconds (``task.env_latency_ms``) without
    blocking the event loop; ``[0, 0]``: no wait.

    Raises:
        ConfigError: not two finite numbers ``0 <= low <= high <= 60000``.
    """

    def __init__(self, bounds_ms: Sequence[float] = (0, 0), seed: int | None = None) -> None:
        bounds = list(bounds_ms)
        if (
            len(bounds) != 2
            or not all(isinstance(b, int | float) and math.isfinite(b) for b in bounds)
            or not (0 <= bounds[0] <= bounds[1] <= 60_000)
        ):
            raise ConfigError(
                f"task.env_latency_ms={bounds!r}: give [low, high] milliseconds with 0 <= low <= high <= 60000, "
                "e.g. [50, 200]; [0, 0] for none."
            )
        self.low_s, self.high_s = bounds[0] / 1000, bounds[1] / 1000
        self.rng = random.Random(seed)

    async def wait(self) -> None:
        if self.high_s > 0:
            await asyncio.sleep(self.rng.uniform(self.low_s, self.high_s))


@dataclass
class Task:
    """What a training run learns.

    Attributes:
        name: a label (also the default ``data_source``).
        train, val: lists of task dicts, each with ``"prompt"`` (str), ``"answer"`` (str) and
            ``"data_source"``; validation pass@k is reported per data source.
        reward_fn: ``reward_fn(task, response_text) -> float``; 1.0 counts as correct.
        reward_components: named reward functions scored beside ``reward_fn`` for multi-objective
            estimators (``gdpo``: each normalised in its group, then summed); empty: none.
        alphabet: the characters of every prompt and answer (the default tokenizer's vocabulary).
        workflow: the workflow class that runs the task; None: ``SingleTurnWorkflow`` with ``reward_fn``.
        workflow_args: keyword arguments of ``workflow`` (used only when ``workflow`` is given).
        precomputed_advantage: the workflow writes per-token advantages, so the run needs
            ``rllm.algorithm.use_precomputed_advantage=true`` (otherwise they would be overwritten).
        answer_in_response: the reward scores the whole answer in the response (exact or
            positional match), so ``rllm.rollout.max_new_tokens`` must hold the longest answer
            (checked at start-up).
        max_new_tokens: the task's own response length, taken when ``rllm.rollout.max_new_tokens``
            is not set; None: twice the longest answer's tokens (the torch backend's
            :mod:`~rllm_torch.backends.torch_backend.task_defaults`).
    """

    name: str
    train: list[dict]
    val: list[dict]
    reward_fn: RewardFn
    alphabet: str
    reward_components: dict[str, RewardFn] = field(default_factory=dict)
    workflow: type | None = None
    workflow_args: dict = field(default_factory=dict)
    precomputed_advantage: bool = False
    answer_in_response: bool = False
    max_new_tokens: int | None = None


def exact_match_reward(task: dict, response: str) -> float:
    """1.0 when the response, stripped of surrounding whitespace, equals ``task["answer"]``, else 0.0.

    Examples:
        >>> exact_match_reward({"answer": "7"}, " 7"), exact_match_reward({"answer": "7"}, "77")
        (1.0, 0.0)
    """
    return 1.0 if response.strip() == str(task["answer"]).strip() else 0.0


def alphabet_of(*datasets: list[dict]) -> str:
    """The sorted distinct characters of every prompt and answer."""
    return "".join(sorted({ch for rows in datasets for row in rows for ch in f"{row['prompt']}{row['answer']}"}))


def seeded_splits(
    problems: Callable[..., list[dict]], task_config: Any, **options: Any
) -> tuple[list[dict], list[dict]]:
    """The train and validation lists of a generated task: ``problems(task_config.train_size,
    seed=task_config.seed, **options)`` and ``problems(task_config.val_size, seed=task_config.seed
    + 1, **options)``, independent draws of the same problems (``options``: the task's own settings).

    Raises:
        whatever ``problems`` raises for a bad setting (a ``ConfigError`` naming it), the train split first.

    Examples:
        >>> from types import SimpleNamespace
        >>> seeded_splits(lambda n, *, seed, step: [seed + step * i for i in range(n)],
        ...               SimpleNamespace(train_size=3, val_size=2, seed=10), step=5)
        ([10, 15, 20], [11, 16])
    """
    train = problems(task_config.train_size, seed=task_config.seed, **options)
    val = problems(task_config.val_size, seed=task_config.seed + 1, **options)
    return train, val
