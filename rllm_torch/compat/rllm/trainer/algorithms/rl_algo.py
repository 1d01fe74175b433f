"""``rllm.trainer.algorithms.rl_algo``: the per-group GRPO and RLOO functions. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rllm.arrays import calculate_grpo_advantages_per_group, calculate_rloo_advantages_per_group

__all__ = ["calculate_grpo_advantages_per_group", "calculate_rloo_advantages_per_group"]
