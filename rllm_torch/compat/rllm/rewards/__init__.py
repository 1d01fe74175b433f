"""``rllm.rewards``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.workflow import RewardOutput

__all__ = ["RewardOutput"]
