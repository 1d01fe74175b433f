"""rLLM's surface over the core: the trajectory data model (:mod:`~rllm_torch.rllm.types`), the
algorithm config (:mod:`~rllm_torch.rllm.config`), the estimator registry
(:mod:`~rllm_torch.rllm.registry`, with the built-ins in :mod:`~rllm_torch.rllm.builtins`, called
through :mod:`~rllm_torch.rllm.dispatch`), rLLM's
list-of-arrays functions (:mod:`~rllm_torch.rllm.arrays`), the reward and advantage metrics
(:mod:`~rllm_torch.rllm.metrics`) and ``collect_reward_and_advantage_from_trajectory_groups``
(:mod:`~rllm_torch.rllm.collect`). Names follow rLLM's ``rllm.experimental.common``.
"""

from rllm_torch.rllm import builtins as _builtins  # noqa: F401 - registers the built-in estimators
from rllm_torch.rllm.arrays import (
    calculate_echo_advantages,
    calculate_grpo_advantages,
    calculate_grpo_advantages_per_group,
    calculate_prpo_advantages,
    calculate_reinforce_advantages,
    calculate_reinforce_plus_plus_baseline_advantages,
    calculate_rloo_advantages,
    calculate_rloo_advantages_per_group,
    get_adv_estimator,
    get_rllm_adv_estimator,
)
from rllm_torch.rllm.collect import collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.rllm.config import AlgorithmConfig, RolloutCorrectionConfig, rLLMAdvantageEstimator
from rllm_torch.rllm.dispatch import compute_advantages, get_tensor_adv_estimator
from rllm_torch.rllm.registry import (
    estimator_options,
    is_token_level,
    register_adv_estimator,
    register_rllm_adv_estimator,
    registered_estimator_names,
)
from rllm_torch.rllm.registry_view import RLLM_ADV_ESTIMATOR_REGISTRY
from rllm_torch.rllm.types import Episode, Step, TerminationReason, Trajectory, TrajectoryGroup

__all__ = [
    "AlgorithmConfig",
    "RolloutCorrectionConfig",
    "RLLM_ADV_ESTIMATOR_REGISTRY",
    "register_adv_estimator",
    "rLLMAdvantageEstimator",
    "Step",
    "Trajectory",
    "TrajectoryGroup",
    "Episode",
    "TerminationReason",
    "compute_advantages",
    "is_token_level",
    "estimator_options",
    "get_rllm_adv_estimator",
    "get_adv_estimator",
    "get_tensor_adv_estimator",
    "register_rllm_adv_estimator",
    "registered_estimator_names",
    "calculate_echo_advantages",
    "calculate_grpo_advantages",
    "calculate_reinforce_advantages",
    "calculate_reinforce_plus_plus_baseline_advantages",
    "calculate_rloo_advantages",
    "calculate_prpo_advantages",
    "calculate_grpo_advantages_per_group",
    "calculate_rloo_advantages_per_group",
    "collect_reward_and_advantage_from_trajectory_groups",
]
