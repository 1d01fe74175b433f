"""``rllm.trainer.algorithms.rejection_sampling``: rejection sampling and group filtering. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.pipeline.rejection_sampling import (
    RejectionSamplingConfig,
    RejectionSamplingState,
    apply_rejection_sampling_and_filtering,
)

__all__ = ["RejectionSamplingConfig", "RejectionSamplingState", "apply_rejection_sampling_and_filtering"]
