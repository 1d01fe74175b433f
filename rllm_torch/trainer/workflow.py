"""What a workflow is and what it samples from: a :class:`Workflow` turns a task into an
:class:`~rllm_torch.rllm.types.Episode`, sampling completions (:class:`ModelOutput`) from a
:class:`RolloutEngine` (a backend's sampler). The tasks and workflows of each domain are in
:mod:`rllm_torch.rollouts`; :mod:`~rllm_torch.trainer.workflow_engine` runs many at once."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from rllm_torch.rllm.types import Episode, Step

__all__ = ["ModelOutput", "RolloutEngine", "Workflow"]


@dataclass
class ModelOutput:
    """One sampled completion.

    Attributes:
        text: the decoded response, without its final end token (other special tokens are kept).
        prompt_ids: prompt token ids.
        response_ids: sampled response token ids, ``T`` of them (including the end token if sampled).
        logprobs: ``T`` per-token sampling log-probs (nats) of the temperature-scaled distribution.
        finish_reason: ``"stop"`` (end token sampled) or ``"length"`` (``max_new_tokens`` reached).
    """

    text: str
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"
    info: dict = field(default_factory=dict)

    def to_step(self, reward: float, **fields) -> Step:
        """The :class:`~rllm_torch.rllm.types.Step` of this completion (ids, log-probs, text) with
        ``reward``; ``fields`` sets other Step fields (``done``, ``observation``, ...)."""
        return Step(
            prompt_ids=self.prompt_ids,
            response_ids=self.response_ids,
            logprobs=self.logprobs,
            reward=reward,
            model_response=self.text,
            **fields,
        )


class RolloutEngine(ABC):
    """Samples completions. ``validation`` switches to the validation sampling settings."""

    validation: bool = False

    @abstractmethod
    async def generate(self, prompt: str) -> ModelOutput:
        """Sample one completion of ``prompt``."""


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
