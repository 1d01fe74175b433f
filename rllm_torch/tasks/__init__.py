"""Tasks: datasets of prompts and answers with a reward function (default: arithmetic)."""

from rllm_torch.tasks.arithmetic import arithmetic_problems, arithmetic_task
from rllm_torch.tasks.base import Task, build_task, exact_match_reward
from rllm_torch.tasks.file_task import file_task, load_reward_fn, load_rows

__all__ = ["Task", "build_task", "exact_match_reward", "arithmetic_problems", "arithmetic_task", "file_task", "load_rows", "load_reward_fn"]
