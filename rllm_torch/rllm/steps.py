"""One model call of a trajectory: ``Step``, the ``Action`` it took and why an episode ended
(``TerminationReason``): rLLM's types, with the fields rLLM's code reads. The trajectories,
groups and episodes are in :mod:`~rllm_torch.rllm.types`."""

from __future__ import annotations

import numbers
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidRewardTypeError, InvalidTrajectoryError

__all__ = ["TerminationReason", "Action", "Step", "MetadataAlias", "without_images", "parse_termination_reason"]


class TerminationReason(str, Enum):
    """Why an episode ended (rLLM's values). ``TerminationReason("timeout")`` reads the string
    form; an unknown string raises ``ValueError`` (no fallback member)."""

    MAX_PROMPT_LENGTH_EXCEEDED = "max_prompt_length_exceeded"
    MAX_RESPONSE_LENGTH_EXCEEDED = "max_response_length_exceeded"
    ENV_DONE = "env_done"
    MAX_TURNS_EXCEEDED = "max_turns_exceeded"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"
    ERROR = "error"


@dataclass(slots=True)
class Action:
    """An action an agent emitted (rLLM's ``Action``): ``action`` is anything (a string, a tool call)."""

    action: Any = None


class MetadataAlias:
    """rLLM's ``metadata`` as another name of ``info`` (rLLM's ``Step``, ``Trajectory`` and
    ``Episode`` call it both)."""

    __slots__ = ()

    @property
    def metadata(self) -> dict:
        return self.info

    @metadata.setter
    def metadata(self, value: dict) -> None:
        self.info = value


def without_images(task: Any) -> Any:
    """A task dict as rLLM's ``to_dict`` writes it: without its ``image`` / ``images`` payloads."""
    return {k: v for k, v in task.items() if k not in ("image", "images")} if isinstance(task, dict) else task


@dataclass(slots=True, eq=False)
class Step(MetadataAlias):
    """One model call of a trajectory.

    Attributes:
        prompt_ids: prompt token ids.
        response_ids: response token ids, ``T`` of them.
        logprobs: sampling log-probabilities of the response tokens (nats), ``T`` of them or empty.
        reward: the step's reward (used as the trajectory reward when that is missing).
        done: whether the environment ended after this step.
        info: free-form metadata.
        advantage: ``None`` (not computed), a Python float (one value for the whole step: what
            the collector writes in RL mode; the backend multiplies it by the response mask), or
            a per-token list of ``T`` floats (precomputed mode).
        response_mask: optional ``T`` 0/1 values (list or 1-D tensor), 1 where a response token
            is trained; ``None`` means every response token is.
        model_response, observation, action, thought, chat_completions: the text-level content
            (rLLM's fields), for logging and for the workflow's own use.
        model_output: the completion this step came from (a
            :class:`~rllm_torch.trainer.workflow.ModelOutput`); its ``prompt_ids``,
            ``completion_ids`` and ``logprobs`` fill the step's empty ones, as in rLLM.
        mc_return, weight_version, id, input, output: rLLM's fields, carried as given
            (``weight_version``: the policy version that sampled it, from ``model_output``).
    """

    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict = field(default_factory=dict)
    advantage: float | list[float] | None = None
    response_mask: list[int] | Tensor | None = None
    model_response: str = ""
    observation: Any = None
    action: Any = None
    thought: str = ""
    chat_completions: list[dict] = field(default_factory=list)
    model_output: Any = None
    mc_return: float = 0.0
    weight_version: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    input: Any = None
    output: Any = None

    def __post_init__(self) -> None:
        out = self.model_output
        if out is None:
            return
        if not self.prompt_ids and getattr(out, "prompt_ids", None) is not None:
            self.prompt_ids = list(out.prompt_ids)
        if not self.response_ids and getattr(out, "completion_ids", None) is not None:
            self.response_ids = list(out.completion_ids)
        if not self.logprobs and getattr(out, "logprobs", None) is not None:
            self.logprobs = list(out.logprobs)
        if not self.model_response and getattr(out, "content", None):
            self.model_response = out.content
        if self.weight_version is None:
            self.weight_version = getattr(out, "weight_version", None)
        if self.logprobs and len(self.logprobs) != len(self.response_ids):
            raise InvalidTrajectoryError(
                f"step has {len(self.response_ids)} response tokens but {len(self.logprobs)} log-probs; give one per token."
            )

    def to_dict(self) -> dict:
        """The step as plain data (rLLM's ``Step.to_dict`` keys)."""
        action = self.action.action if isinstance(self.action, Action) else self.action
        mask = self.response_mask.tolist() if isinstance(self.response_mask, Tensor) else self.response_mask
        return {
            "prompt_ids": list(self.prompt_ids),
            "response_ids": list(self.response_ids),
            "logprobs": list(self.logprobs),
            "chat_completions": list(self.chat_completions),
            "observation": self.observation,
            "thought": self.thought,
            "action": action,
            "model_response": self.model_response,
            "model_output": self.model_output.to_dict() if hasattr(self.model_output, "to_dict") else None,
            "info": self.info,
            "reward": self.reward,
            "done": self.done,
            "mc_return": self.mc_return,
            "advantage": self.advantage,
            "weight_version": self.weight_version,
            "response_mask": mask,
        }

    def response_mask_tensor(self) -> Tensor:
        """``[T]`` float32 mask of this step's response tokens (ones when ``response_mask`` is None).

        Raises:
            InvalidTrajectoryError (a ValueError): ``response_mask`` does not have one entry per
                response token, or holds a value other than 0 and 1.
        """
        num_tokens = len(self.response_ids)
        if self.response_mask is None:
            return torch.ones(num_tokens, dtype=torch.float32)
        mask_T = torch.as_tensor(self.response_mask, dtype=torch.float32).reshape(-1)
        if mask_T.shape[0] != num_tokens:
            raise InvalidTrajectoryError(
                f"response_mask has {mask_T.shape[0]} entries but the step has {num_tokens} response tokens; give one per token."
            )
        bad_T = (mask_T != 0) & (mask_T != 1)
        if bad_T.any():
            position = int(bad_T.nonzero()[0, 0])
            raise InvalidTrajectoryError(
                f"response_mask holds {mask_T[position].item():g} at token {position}; it must hold only 0 (not trained) and 1 (trained), since the mask multiplies the advantage."
            )
        return mask_T

    def token_advantages(self, *, length_mismatch: str = "raise") -> Tensor:
        """``[T]`` float32 advantage of each response token: a scalar ``advantage`` times the
        response mask, or a per-token list as given (masked tokens keep their value; the
        backend masks the loss). ``advantage=None`` gives zeros.

        Args:
            length_mismatch: a per-token list of the wrong length: ``"raise"``, or ``"zeros"``
                (rLLM's: the step gets zeros; the caller warns, see ``AlgorithmConfig.compat``).

        Raises:
            ValueError: a per-token list (with ``length_mismatch="raise"``) or the mask has the wrong length.
            TypeError: ``advantage`` is neither None, a real number nor a list/tuple/1-D tensor.

        Examples:
            >>> Step(response_ids=[5, 6, 7], response_mask=[1, 0, 1], advantage=0.5).token_advantages()
            tensor([0.5000, 0.0000, 0.5000])
        """
        adv = self.advantage
        if adv is None:
            return torch.zeros(len(self.response_ids), dtype=torch.float32)
        if isinstance(adv, numbers.Real):
            return self.response_mask_tensor() * float(adv)
        if isinstance(adv, (list, tuple, Tensor)):
            adv_T = torch.as_tensor(adv, dtype=torch.float32).reshape(-1)
            if adv_T.shape[0] != len(self.response_ids):
                if length_mismatch == "zeros":
                    return torch.zeros(len(self.response_ids), dtype=torch.float32)
                raise InvalidTrajectoryError(
                    f"advantage has {adv_T.shape[0]} entries but the step has {len(self.response_ids)} response tokens "
                    "(rllm.algorithm.compat=rllm gives such a step zeros, with a warning, as rLLM does)."
                )
            return adv_T
        raise InvalidRewardTypeError(
            f"step.advantage must be None, a number or a per-token list, got {type(adv).__name__}."
        )


def parse_termination_reason(value: object, where: str) -> TerminationReason:
    """A :class:`TerminationReason` from a member or its string value (case-insensitive)."""
    if isinstance(value, TerminationReason):
        return value
    if isinstance(value, str):
        try:
            return TerminationReason(value.lower())
        except ValueError:
            pass
    valid = ", ".join(repr(r.value) for r in TerminationReason)
    raise InvalidTrajectoryError(f"{where}: termination reason {value!r} is not one of {valid}.")
