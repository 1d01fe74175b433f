"""What a workflow samples from: a ``RolloutEngine`` turns a prompt into a ``ModelOutput``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from rllm_torch.rllm.types import Step

__all__ = ["ModelOutput", "RolloutEngine"]


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
