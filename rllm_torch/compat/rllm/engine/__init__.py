"""``rllm.engine``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.workflow import ModelOutput, RolloutEngine
from rllm_torch.trainer.workflow_engine import UnifiedWorkflowEngine

__all__ = ["ModelOutput", "RolloutEngine", "UnifiedWorkflowEngine"]
