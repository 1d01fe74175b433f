"""The tasks a run can name (``task.name``) and the one function that builds them. It imports
the task modules; they import only :mod:`rllm_torch.rollouts.task`, so there is no import circle."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rollouts.arithmetic import arithmetic_task
from rllm_torch.rollouts.chain import chain_task
from rllm_torch.rollouts.distill import distill_task
from rllm_torch.rollouts.file_task import file_task
from rllm_torch.rollouts.guess import guess_task
from rllm_torch.rollouts.reasoning_gym import reasoning_gym_task
from rllm_torch.rollouts.reverse import reverse_task
from rllm_torch.rollouts.task import Task
from rllm_torch.rollouts.word_addition import word_addition_task

__all__ = ["TASK_BUILDERS", "TASK_NAMES", "build_task"]

TASK_BUILDERS: dict[str, Callable[[Any], Task]] = {
    "arithmetic": arithmetic_task,
    "chain": chain_task,
    "distill": distill_task,
    "file": file_task,
    "guess": guess_task,  # multi-turn, the policy's guesses decide how many turns
    "reverse": reverse_task,
    "word_addition": word_addition_task,  # for a pretrained chat model
    "reasoning_gym": reasoning_gym_task,  # imports its optional package only when built
}
TASK_NAMES = tuple(TASK_BUILDERS)


def build_task(task_config: Any) -> Task:
    """The task named by ``task_config.name``: ``arithmetic`` (the default, generated),
    ``chain`` (multi-turn arithmetic), ``guess`` (guess a number with higher/lower feedback,
    variable turn counts), ``distill`` (precomputed advantages from a teacher),
    ``reverse`` (reverse a string of digits, partial credit), ``word_addition`` (additions
    asked in words, for a pretrained chat model), ``file`` (JSONL/Parquet files of
    prompts and answers) or ``reasoning_gym`` (optional extra).

    Raises:
        ConfigError: an unknown task name; see also the builders.
    """
    builder = TASK_BUILDERS.get(task_config.name)
    if builder is None:
        raise ConfigError(f"task.name={task_config.name!r} is not one of {TASK_NAMES}.")
    return builder(task_config)
