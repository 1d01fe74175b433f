"""``rllm.rewards.countdown_reward``: the countdown reward. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rollouts.countdown import countdown_reward_fn

__all__ = ["countdown_reward_fn"]
