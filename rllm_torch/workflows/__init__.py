"""Workflows (task → episode) and the engine that runs many of them at once."""

from rllm_torch.workflows.base import Workflow
from rllm_torch.workflows.chain import ArithmeticChainWorkflow
from rllm_torch.workflows.distill import AnswerTeacher, DistillationWorkflow
from rllm_torch.workflows.engine import EpisodeLogger, UnifiedWorkflowEngine
from rllm_torch.workflows.rollout import ModelOutput, RolloutEngine
from rllm_torch.workflows.single_turn import SingleTurnWorkflow

__all__ = [
    "Workflow",
    "SingleTurnWorkflow",
    "ArithmeticChainWorkflow",
    "DistillationWorkflow",
    "AnswerTeacher",
    "UnifiedWorkflowEngine",
    "EpisodeLogger",
    "ModelOutput",
    "RolloutEngine",
]
