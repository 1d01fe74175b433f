"""``rllm.experimental.unified_trainer`` (rLLM before 2026-06). Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.state import TrainerState
from rllm_torch.trainer.unified_trainer import UnifiedTrainer

__all__ = ["TrainerState", "UnifiedTrainer"]
