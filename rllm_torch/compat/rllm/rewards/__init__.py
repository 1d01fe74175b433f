"""``rllm.rewards``: rLLM's reward types, ``RewardFunction`` and ``zero_reward``. Re-exported from
the one implementation (:mod:`rllm_torch.rollouts.rllm_rewards`)."""

from rllm_torch.rollouts.rllm_rewards import RewardConfig, RewardFunction, RewardInput, RewardType, zero_reward
from rllm_torch.trainer.workflow import RewardOutput

__all__ = ["RewardInput", "RewardOutput", "RewardType", "RewardConfig", "RewardFunction", "zero_reward"]
