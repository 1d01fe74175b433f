"""``rllm.engine.unified_workflow_engine``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.trainer.workflow_engine import UnifiedWorkflowEngine

__all__ = ["UnifiedWorkflowEngine"]
