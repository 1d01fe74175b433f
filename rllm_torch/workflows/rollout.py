"""What a workflow samples from: a ``RolloutEngine`` turns a prompt into a ``ModelOutput``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

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


class RolloutEngine(ABC):
    """Samples completions. ``validation`` switches to the validation sampling settings."""

    validation: bool = False

    @abstractmethod
    async def generate(self, prompt: str) -> ModelOutput:
        """Sample one completion of ``prompt``."""
