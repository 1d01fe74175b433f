"""``rllm.rewards.reward_fn``: a reward function is ``fn(task_info, action) -> RewardOutput | float | bool``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.workflow import RewardOutput

__all__ = ["RewardOutput"]
