"""The training framework over the rLLM surface, backend-agnostic: the loop
(:class:`UnifiedTrainer`), what a backend provides (:class:`BackendProtocol`), the typed run
config (:mod:`~rllm_torch.trainer.schema`), the workflows' base and engine
(:mod:`~rllm_torch.trainer.workflow`, :mod:`~rllm_torch.trainer.workflow_engine`), and three
subpackages: :mod:`~rllm_torch.trainer.pipeline` (episodes to the token batch and its
advantages), :mod:`~rllm_torch.trainer.runtime` (processes, checkpoints, resume) and
:mod:`~rllm_torch.trainer.logs` (metrics sinks, the start-up summary). Concrete backends
(:mod:`rllm_torch.backends`) and tasks (:mod:`rllm_torch.rollouts`) build on it."""

from rllm_torch.trainer.logs.tracking import Tracking
from rllm_torch.trainer.pipeline.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.pipeline.rejection_sampling import (
    RejectionSamplingConfig,
    RejectionSamplingState,
    apply_rejection_sampling_and_filtering,
)
from rllm_torch.trainer.pipeline.token_advantages import compute_token_advantages
from rllm_torch.trainer.pipeline.token_batch import TokenBatch, build_token_batch
from rllm_torch.trainer.pipeline.transform import (
    TransformConfig,
    build_trajectory_groups,
    default_traj_grouping_hook,
    propagate_trajectory_rewards,
    transform_episodes_to_trajectory_groups,
)
from rllm_torch.trainer.pipeline.validation import unbiased_pass_at_k, validation_pass_metrics
from rllm_torch.trainer.protocol import BackendProtocol
from rllm_torch.trainer.runtime.checkpoint import CheckpointInfo, CheckpointStore
from rllm_torch.trainer.runtime.run_checkpoint import RunCheckpointer
from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.unified_trainer import UnifiedTrainer
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
