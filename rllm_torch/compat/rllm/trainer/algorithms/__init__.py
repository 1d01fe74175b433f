"""``rllm.trainer.algorithms``: the algorithm utilities. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rllm.collect import collect_reward_and_advantage_from_trajectory_groups
from rllm_torch.rllm.config import AlgorithmConfig, RolloutCorrectionConfig, rLLMAdvantageEstimator
from rllm_torch.rllm.config_fields import load_loss_plugins
from rllm_torch.trainer.pipeline.async_rollouts import AsyncTrainingConfig
from rllm_torch.trainer.pipeline.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.pipeline.rejection_sampling import (
    RejectionSamplingConfig,
    RejectionSamplingState,
    apply_rejection_sampling_and_filtering,
)
from rllm_torch.trainer.pipeline.transform import TransformConfig, transform_episodes_to_trajectory_groups

__all__ = [
    "AlgorithmConfig",
    "AsyncTrainingConfig",
    "CompactFilteringConfig",
    "RejectionSamplingConfig",
    "RejectionSamplingState",
    "RolloutCorrectionConfig",
    "TransformConfig",
    "apply_rejection_sampling_and_filtering",
    "collect_reward_and_advantage_from_trajectory_groups",
    "load_loss_plugins",
    "rLLMAdvantageEstimator",
    "transform_episodes_to_trajectory_groups",
]
