"""The trainer's data pipeline: episodes → trajectory groups → filtered groups."""

from rllm_torch.trainer.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.rejection_sampling import RejectionSamplingConfig, RejectionSamplingState, apply_rejection_sampling_and_filtering
from rllm_torch.trainer.transform import (
    TransformConfig,
    build_trajectory_groups,
    default_traj_grouping_hook,
    propagate_trajectory_rewards,
    transform_episodes_to_trajectory_groups,
)

__all__ = [
    "CompactFilteringConfig",
    "TransformConfig",
    "transform_episodes_to_trajectory_groups",
    "default_traj_grouping_hook",
    "build_trajectory_groups",
    "propagate_trajectory_rewards",
    "RejectionSamplingConfig",
    "RejectionSamplingState",
    "apply_rejection_sampling_and_filtering",
]
