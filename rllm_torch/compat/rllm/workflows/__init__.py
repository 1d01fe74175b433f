"""``rllm.workflows``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.compat.rllm.workflows.simple_workflow import SimpleWorkflow
from rllm_torch.compat.rllm.workflows.workflow import TerminationEvent, TerminationReason, Workflow

__all__ = ["SimpleWorkflow", "TerminationEvent", "TerminationReason", "Workflow"]
