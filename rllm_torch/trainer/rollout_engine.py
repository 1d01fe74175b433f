"""What a workflow samples from (rLLM's ``rllm.engine.rollout``): a :class:`RolloutEngine` (a
backend's sampler) gives :class:`ModelOutput` completions of a prompt or a chat; what a task asks
is read as rLLM's ``SimpleWorkflow`` reads it (:func:`task_messages`)."""

from __future__ import annotations

import contextvars
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from rllm_torch.core.errors import ConfigError
from rllm_torch.rllm.types import Step

__all__ = ["ModelOutput", "RolloutEngine", "SAMPLED_VERSIONS", "PROMPT_KEYS", "task_messages"]

SAMPLED_VERSIONS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "rllm_torch_sampled_versions", default=None
)
"""The policy versions of the completions one episode sampled, in order (one per ``generate``
call): the workflow engine sets a fresh list in each episode's task, and a rollout engine whose
weights carry a version (async training's sampler) appends it; None outside an episode."""

#: The task keys a prompt is read from, in rLLM's ``SimpleWorkflow`` order.
PROMPT_KEYS = ("messages", "question", "prompt", "problem")


def task_messages(task: dict) -> list[dict] | str:
    """What a task asks, as rLLM's ``SimpleWorkflow`` reads it: its ``messages`` (a chat), else
    its ``question``, ``prompt`` or ``problem`` (a string).

    Raises:
        ConfigError: the task has none of these keys (the message lists the keys it has).
    """
    for key in PROMPT_KEYS:
        if isinstance(task, dict) and task.get(key) is not None:
            return task[key]
    keys = sorted(task) if isinstance(task, dict) else type(task).__name__
    raise ConfigError(
        f"a task needs one of {', '.join(PROMPT_KEYS)} (rLLM's keys); this one has {keys}. For task=file, "
        "task.prompt_key names the column."
    )


@dataclass
class ModelOutput:
    """One sampled completion (rLLM's ``ModelOutput``, its fields in its order, and ``info``).

    Attributes:
        text: the decoded response, without its final end token (other special tokens are kept).
        content: the response's answer part (rLLM separates a reasoning part; here the same as
            ``text``, which it defaults to).
        reasoning: the reasoning part, None here.
        prompt_ids: prompt token ids.
        completion_ids: sampled response token ids, ``T`` of them (with the end token if sampled);
            also :attr:`response_ids`.
        logprobs: ``T`` per-token sampling log-probs (nats) of the temperature-scaled distribution.
        prompt_length, completion_length: their lengths (filled from the ids when 0).
        finish_reason: ``"stop"`` (end token sampled) or ``"length"`` (``max_new_tokens`` reached).
        weight_version: the policy version of the weights that sampled it (async training), or None.
        tool_calls, multi_modal_inputs, prompt_logprobs, routing_matrices, metrics: rLLM's, None here.
        info: free-form; ``"policy_version"``: the same as ``weight_version``.
    """

    text: str | None = None
    content: str | None = None
    reasoning: str | None = None
    tool_calls: list | None = None
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    multi_modal_inputs: dict | None = None
    logprobs: list[float] | None = None
    prompt_logprobs: list[float] | None = None
    routing_matrices: list[str] | None = None
    prompt_length: int = 0
    completion_length: int = 0
    finish_reason: str | None = "stop"
    weight_version: int | None = None
    metrics: dict | None = None
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.content is None:
            self.content = self.text
        if not self.prompt_length and self.prompt_ids is not None:
            self.prompt_length = len(self.prompt_ids)
        if not self.completion_length and self.completion_ids is not None:
            self.completion_length = len(self.completion_ids)

    @property
    def response_ids(self) -> list[int]:
        """The sampled token ids (:attr:`completion_ids`)."""
        return self.completion_ids if self.completion_ids is not None else []

    @response_ids.setter
    def response_ids(self, value: list[int]) -> None:
        self.completion_ids = value

    def to_step(self, reward: float, **fields) -> Step:
        """The :class:`~rllm_torch.rllm.types.Step` of this completion (ids, log-probs, text) with
        ``reward``; ``fields`` sets other Step fields (``done``, ``observation``, ...)."""
        return Step(
            prompt_ids=self.prompt_ids or [],
            response_ids=self.response_ids,
            logprobs=self.logprobs or [],
            reward=reward,
            model_response=self.text or "",
            **fields,
        )

    def to_dict(self) -> dict:
        """The output as plain data (rLLM's ``ModelOutput.to_dict`` keys)."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "info"}


class RolloutEngine(ABC):
    """Samples completions (rLLM's ``RolloutEngine``). ``validation`` (rLLM: ``is_validation``)
    switches to the validation sampling settings."""

    validation: bool = False

    @abstractmethod
    async def generate(self, prompt: str | list[dict]) -> ModelOutput:
        """Sample one completion of ``prompt``: a string, or a chat (a list of ``{"role",
        "content"}`` messages) formatted by the backend's tokenizer."""

    async def get_model_response(self, messages: list[dict] | str, **kwargs: Any) -> ModelOutput:
        """rLLM's call: one completion of ``messages`` (:meth:`generate`). ``application_id``
        (rLLM's episode label) is accepted and not needed.

        Raises:
            ConfigError: another keyword (a per-call sampling setting): this engine samples every
                pending prompt of a turn together with the run's settings (``rllm.rollout.*``).
        """
        if extra := sorted(set(kwargs) - {"application_id"}):
            raise ConfigError(
                f"get_model_response got {', '.join(extra)}; sampling settings are the run's (rllm.rollout.temperature, "
                "top_p, max_new_tokens; validation's val_*), the same for every call."
            )
        return await self.generate(messages)

    @property
    def is_validation(self) -> bool:
        """rLLM's name of :attr:`validation`."""
        return self.validation

    @is_validation.setter
    def is_validation(self, value: bool) -> None:
        self.validation = value
