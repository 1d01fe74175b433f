"""``rllm.workflows.workflow``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rllm.types import TerminationReason
from rllm_torch.trainer.workflow import TerminationEvent, Workflow

__all__ = ["TerminationEvent", "TerminationReason", "Workflow"]
