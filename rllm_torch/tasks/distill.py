"""``task=distill``: the arithmetic problems learnt from a fixed teacher's per-token advantages
(:class:`~rllm_torch.workflows.distill.DistillationWorkflow`), alone or mixed with an RL role.
Needs ``rllm.algorithm.use_precomputed_advantage=true``."""

from __future__ import annotations

from typing import Any

from rllm_torch.tasks.arithmetic import arithmetic_problems
from rllm_torch.tasks.base import Task, exact_match_reward
from rllm_torch.workflows.distill import AnswerTeacher, DistillationWorkflow

__all__ = ["distill_task"]


def distill_task(task_config: Any) -> Task:
    """The arithmetic splits of ``task_config`` run by :class:`DistillationWorkflow` with an
    :class:`AnswerTeacher` of confidence 0.9; ``task_config.mix_rl`` adds the RL ``solver`` role."""
    train = arithmetic_problems(task_config.train_size, max_sum=task_config.max_sum, seed=task_config.seed)
    val = arithmetic_problems(task_config.val_size, max_sum=task_config.max_sum, seed=task_config.seed + 1)
    args = {
        "teacher": AnswerTeacher(0.9),
        "reward_fn": exact_match_reward,
        "mix_rl": bool(task_config.get("mix_rl", False)),
    }
    return Task(
        name="distill",
        train=train,
        val=val,
        reward_fn=exact_match_reward,
        alphabet="0123456789+=",
        workflow=DistillationWorkflow,
        workflow_args=args,
        precomputed_advantage=True,
    )
