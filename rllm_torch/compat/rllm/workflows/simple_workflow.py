"""``rllm.workflows.simple_workflow``. Re-exported from the one implementation (:mod:`rllm_torch.compat.rllm`)."""

from rllm_torch.rollouts.simple import SimpleAgent, SimpleWorkflow

__all__ = ["SimpleAgent", "SimpleWorkflow"]
