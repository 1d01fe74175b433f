"""``Workflow``: one agent program that turns a task into an :class:`~rllm_torch.rllm.types.Episode`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from rllm_torch.rllm.types import Episode
from rllm_torch.workflows.rollout import RolloutEngine

__all__ = ["Workflow"]


class Workflow(ABC):
    """Base of workflows (rLLM's ``Workflow``). Built as ``workflow_cls(rollout_engine=...,
    **workflow_args)`` once per slot of the engine's pool and reused across tasks.

    ``run`` returns the episode; the engine then sets its ``task_id``, ``rollout_idx``, ``id``
    and ``task``. An exception in ``run`` marks the attempt as failed (the engine retries it).
    """

    def __init__(self, rollout_engine: RolloutEngine, **kwargs: Any) -> None:
        self.rollout_engine = rollout_engine

    @abstractmethod
    async def run(self, task: dict, uid: str) -> Episode:
        """Run the workflow on ``task``; ``uid`` is ``"{task_id}:{rollout_idx}"`` (a label)."""

    def reset(self) -> None:
        """Called before each task; clear per-task state here."""
