"""Rollouts by domain: each module holds a task's data and reward and, where it needs one, its
own workflow (on :class:`~rllm_torch.trainer.workflow.Workflow`). ``task.name`` picks one
(:func:`~rllm_torch.rollouts.catalog.build_task`):

* :mod:`~rllm_torch.rollouts.arithmetic` (the default) and :mod:`~rllm_torch.rollouts.reverse`,
  run by :class:`~rllm_torch.rollouts.single_turn.SingleTurnWorkflow`;
* :mod:`~rllm_torch.rollouts.chain`: multi-turn arithmetic and its workflow;
* :mod:`~rllm_torch.rollouts.guess`: guess a number with higher/lower feedback (the policy decides
  how many turns);
* :mod:`~rllm_torch.rollouts.distill`: on-policy distillation from a teacher (precomputed advantages);
* :mod:`~rllm_torch.rollouts.file_task`: JSONL/Parquet files with a reward function by name;
* :mod:`~rllm_torch.rollouts.reasoning_gym`: reasoning-gym datasets (an optional extra);
* :mod:`~rllm_torch.rollouts.simple` (rLLM's ``SimpleWorkflow``) and
  :mod:`~rllm_torch.rollouts.countdown` (rLLM's countdown rows and reward), for ported rLLM code.

:mod:`~rllm_torch.rollouts.task` is what a task is.
"""

from rllm_torch.rollouts.arithmetic import arithmetic_problems, arithmetic_task
from rllm_torch.rollouts.catalog import TASK_NAMES, build_task
from rllm_torch.rollouts.chain import ArithmeticChainWorkflow, chain_problems, chain_task
from rllm_torch.rollouts.countdown import countdown_reward_fn, countdown_rows
from rllm_torch.rollouts.distill import AnswerTeacher, DistillationWorkflow, distill_task
from rllm_torch.rollouts.file_task import file_task, load_reward_fn, load_rows
from rllm_torch.rollouts.guess import GuessNumberWorkflow, guess_problems, guess_task
from rllm_torch.rollouts.reasoning_gym import ReasoningGymScorer, reasoning_gym_rows, reasoning_gym_task
from rllm_torch.rollouts.simple import SimpleWorkflow
from rllm_torch.rollouts.single_turn import SingleTurnWorkflow
from rllm_torch.rollouts.task import Task, exact_match_reward

__all__ = [
    "Task",
    "build_task",
    "TASK_NAMES",
    "exact_match_reward",
    "SingleTurnWorkflow",
    "SimpleWorkflow",
    "countdown_reward_fn",
    "countdown_rows",
    "arithmetic_problems",
    "arithmetic_task",
    "file_task",
    "load_rows",
    "load_reward_fn",
    "chain_problems",
    "chain_task",
    "GuessNumberWorkflow",
    "guess_problems",
    "guess_task",
    "ArithmeticChainWorkflow",
    "distill_task",
    "DistillationWorkflow",
    "AnswerTeacher",
    "reasoning_gym_rows",
    "reasoning_gym_task",
    "ReasoningGymScorer",
]
