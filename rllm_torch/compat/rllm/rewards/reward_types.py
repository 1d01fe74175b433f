"""``rllm.rewards.reward_types``: rLLM's reward data types, same fields and defaults.
Re-exported from the one implementation (:mod:`rllm_torch.rollouts.rllm_rewards`)."""

from rllm_torch.rollouts.rllm_rewards import LiveCodebenchInput, RewardConfig, RewardInput, RewardType
from rllm_torch.trainer.workflow import RewardOutput

__all__ = ["RewardConfig", "RewardType", "RewardInput", "LiveCodebenchInput", "RewardOutput"]
