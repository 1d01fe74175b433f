"""``rllm.trainer.algorithms.advantage``: the advantage estimators, their registry and the collector. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rllm.arrays import (
    calculate_echo_advantages,
    calculate_grpo_advantages,
    calculate_prpo_advantages,
    calculate_reinforce_advantages,
    calculate_reinforce_plus_plus_baseline_advantages,
    calculate_rloo_advantages,
    get_adv_estimator,
    get_rllm_adv_estimator,
)
from rllm_torch.rllm.collect import collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.rllm.config import AlgorithmConfig, rLLMAdvantageEstimator
from rllm_torch.rllm.registry import register_adv_estimator, register_rllm_adv_estimator
from rllm_torch.rllm.registry_view import RLLM_ADV_ESTIMATOR_REGISTRY

__all__ = [
    "AlgorithmConfig",
    "RLLM_ADV_ESTIMATOR_REGISTRY",
    "calculate_echo_advantages",
    "calculate_grpo_advantages",
    "calculate_prpo_advantages",
    "calculate_reinforce_advantages",
    "calculate_reinforce_plus_plus_baseline_advantages",
    "calculate_rloo_advantages",
    "collect_reward_and_advantage_from_trajectory_groups",
    "get_adv_estimator",
    "get_rllm_adv_estimator",
    "rLLMAdvantageEstimator",
    "register_adv_estimator",
    "register_rllm_adv_estimator",
]
