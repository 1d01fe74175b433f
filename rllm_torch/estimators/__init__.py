"""Tensor-native advantage estimators, their registry, and rLLM's list-of-arrays functions.

The built-ins are registered under ``rLLMAdvantageEstimator`` values: ``grpo``, ``rloo``,
``reinforce``, ``reinforce_plus_plus_baseline`` and ``prpo``.
"""

from rllm_torch.config import rLLMAdvantageEstimator
from rllm_torch.estimators.arrays import (
    calculate_grpo_advantages,
    calculate_grpo_advantages_per_group,
    calculate_prpo_advantages,
    calculate_reinforce_advantages,
    calculate_reinforce_plus_plus_baseline_advantages,
    calculate_rloo_advantages,
    calculate_rloo_advantages_per_group,
)
from rllm_torch.estimators.grpo import grpo
from rllm_torch.estimators.prpo import prpo
from rllm_torch.estimators.registry import (
    compute_advantages,
    get_rllm_adv_estimator,
    get_tensor_adv_estimator,
    register_builtin,
    register_rllm_adv_estimator,
    registered_estimator_names,
)
from rllm_torch.estimators.reinforce import reinforce, reinforce_plus_plus_baseline
from rllm_torch.estimators.rloo import rloo
from rllm_torch.estimators.token_level import broadcast_to_tokens, sequence_scores

__all__ = [
    "grpo",
    "rloo",
    "reinforce",
    "reinforce_plus_plus_baseline",
    "prpo",
    "compute_advantages",
    "sequence_scores",
    "broadcast_to_tokens",
    "get_rllm_adv_estimator",
    "get_tensor_adv_estimator",
    "register_rllm_adv_estimator",
    "registered_estimator_names",
    "calculate_grpo_advantages",
    "calculate_reinforce_advantages",
    "calculate_reinforce_plus_plus_baseline_advantages",
    "calculate_rloo_advantages",
    "calculate_prpo_advantages",
    "calculate_grpo_advantages_per_group",
    "calculate_rloo_advantages_per_group",
]

register_builtin(rLLMAdvantageEstimator.GRPO, calculate_grpo_advantages, grpo)
register_builtin(rLLMAdvantageEstimator.RLOO, calculate_rloo_advantages, rloo)
register_builtin(rLLMAdvantageEstimator.REINFORCE, calculate_reinforce_advantages, reinforce)
register_builtin(
    rLLMAdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE,
    calculate_reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_baseline,
)
register_builtin(rLLMAdvantageEstimator.PRPO, calculate_prpo_advantages, prpo)
