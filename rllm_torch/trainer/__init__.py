"""The trainer's data pipeline: episodes → trajectory groups → filtered groups."""

from rllm_torch.trainer.backend import BackendProtocol
from rllm_torch.trainer.checkpoint import CheckpointInfo, CheckpointStore
from rllm_torch.trainer.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.rejection_sampling import (
    RejectionSamplingConfig,
    RejectionSamplingState,
    apply_rejection_sampling_and_filtering,
)
from rllm_torch.trainer.run_checkpoint import RunCheckpointer
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.token_advantages import compute_token_advantages
from rllm_torch.trainer.token_batch import TokenBatch, build_token_batch
from rllm_torch.trainer.tracking import Tracking
from rllm_torch.trainer.transform import (
    TransformConfig,
    build_trajectory_groups,
    default_traj_grouping_hook,
    propagate_trajectory_rewards,
    transform_episodes_to_trajectory_groups,
)
from rllm_torch.trainer.unified_trainer import UnifiedTrainer
from rllm_torch.trainer.validation import unbiased_pass_at_k, validation_pass_metrics
from rllm_torch.trainer.workflow import ModelOutput, RolloutEngine, Workflow
from rllm_torch.trainer.workflow_engine import EpisodeLogger, UnifiedWorkflowEngine

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
    "UnifiedTrainer",
    "BackendProtocol",
    "compute_token_advantages",
    "TrainerState",
    "TokenBatch",
    "build_token_batch",
    "Tracking",
    "unbiased_pass_at_k",
    "validation_pass_metrics",
    "CheckpointStore",
    "CheckpointInfo",
    "RunCheckpointer",
    "Workflow",
    "RolloutEngine",
    "ModelOutput",
    "UnifiedWorkflowEngine",
    "EpisodeLogger",
]
