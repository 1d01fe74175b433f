"""``rllm.trainer.algorithms.config``: the algorithm and pipeline configs. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rllm.config import AlgorithmConfig, RolloutCorrectionConfig, rLLMAdvantageEstimator
from rllm_torch.trainer.pipeline.async_rollouts import AsyncTrainingConfig
from rllm_torch.trainer.pipeline.compact_filtering import CompactFilteringConfig
from rllm_torch.trainer.pipeline.rejection_sampling import RejectionSamplingConfig
from rllm_torch.trainer.pipeline.transform import TransformConfig

__all__ = [
    "AlgorithmConfig",
    "AsyncTrainingConfig",
    "CompactFilteringConfig",
    "RejectionSamplingConfig",
    "RolloutCorrectionConfig",
    "TransformConfig",
    "rLLMAdvantageEstimator",
]
