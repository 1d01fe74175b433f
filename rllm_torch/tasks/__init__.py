"""Tasks: datasets of prompts and answers with a reward function (default: arithmetic), or with
their own workflow (chain: multi-turn; distill: precomputed advantages); reasoning-gym as a source."""

from rllm_torch.tasks.arithmetic import arithmetic_problems, arithmetic_task
from rllm_torch.tasks.base import Task, exact_match_reward
from rllm_torch.tasks.catalog import TASK_NAMES, build_task
from rllm_torch.tasks.chain import chain_problems, chain_task
from rllm_torch.tasks.distill import distill_task
from rllm_torch.tasks.file_task import file_task, load_reward_fn, load_rows
from rllm_torch.tasks.reasoning_gym import ReasoningGymScorer, reasoning_gym_rows, reasoning_gym_task

__all__ = [
    "Task",
    "build_task",
    "TASK_NAMES",
    "exact_match_reward",
    "arithmetic_problems",
    "arithmetic_task",
    "file_task",
    "load_rows",
    "load_reward_fn",
    "chain_problems",
    "chain_task",
    "distill_task",
    "reasoning_gym_rows",
    "reasoning_gym_task",
    "ReasoningGymScorer",
]
