"""The trajectory data model: ``Step``, ``Trajectory``, ``TrajectoryGroup``, ``Episode``,
``TerminationReason`` (rLLM's ``rllm.agents.agent`` and ``rllm.workflows.workflow`` types).

Differences from rLLM, on purpose:

* ``Episode.task_id``, ``Episode.rollout_idx`` and ``TrajectoryGroup.group_role`` are explicit
  fields. Nothing is recovered by splitting ``"task:rollout"`` or ``"task:role"`` strings.
* ``Step.response_mask`` (optional) says which response tokens are trained; without it every
  token of ``response_ids`` is. :meth:`Step.token_advantages` turns the step's advantage into one
  value per response token with that mask, which is what a backend does in broadcast mode.

The classes are plain mutable dataclasses with ``__slots__`` (cheap attribute writes: the
collector writes ``step.advantage`` on every step of a batch).
"""

from __future__ import annotations

import numbers
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidRewardTypeError, InvalidTrajectoryError

__all__ = [
    "TerminationReason",
    "Step",
    "Trajectory",
    "TrajectoryGroup",
    "Episode",
    "DEFAULT_GROUP_ROLE",
    "parse_termination_reason",
]

DEFAULT_GROUP_ROLE = "default"
"""Role of a :class:`TrajectoryGroup` whose trajectories do not share one name."""


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


@dataclass(slots=True, eq=False)
class Step:
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
        model_response, observation, action: the text-level content, for logging only.
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

    def token_advantages(self) -> Tensor:
        """``[T]`` float32 advantage of each response token: a scalar ``advantage`` times the
        response mask, or a per-token list as given (masked tokens keep their value; the
        backend masks the loss). ``advantage=None`` gives zeros.

        Raises:
            ValueError: a per-token list or the mask has the wrong length.
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
                raise InvalidTrajectoryError(
                    f"advantage has {adv_T.shape[0]} entries but the step has {len(self.response_ids)} response tokens."
                )
            return adv_T
        raise InvalidRewardTypeError(
            f"step.advantage must be None, a number or a per-token list, got {type(adv).__name__}."
        )


@dataclass(slots=True, eq=False)
class Trajectory:
    """The steps of one agent in one episode.

    Attributes:
        name: the agent/role name; trajectories are grouped by (task id, name). Empty means
            unnamed: the transform names it by its position in the episode.
        steps: the steps, in order.
        reward: the trajectory reward; ``None`` until set (the transform then takes the last
            step's reward in broadcast mode).
        info: free-form metadata.
        uid: a unique id (a fresh UUID by default); not used for grouping.
        reward_components: the rewards of several reward functions (the same ones, in the same
            order, for every trajectory of a batch), for multi-objective estimators (``gdpo``);
            ``None``: only ``reward``.
    """

    name: str = ""
    steps: list[Step] = field(default_factory=list)
    reward: float | None = None
    info: dict = field(default_factory=dict)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    reward_components: list[float] | None = None

    def trained_tokens(self) -> int:
        """The number of trained response tokens over every step (OPO's length ``l_i``): a
        step's ``response_mask`` ones, or all its response tokens without a mask."""
        total = 0
        for step in self.steps:
            mask = step.response_mask
            if mask is None:
                total += len(step.response_ids)
            else:
                total += int(mask.sum()) if isinstance(mask, Tensor) else sum(1 for m in mask if m)
        return total

    def is_trained(self) -> bool:
        """Whether some step has a trained response token: a response token where its
        ``response_mask`` is 1, or any response token of a step without a mask. A trajectory
        with none (every mask all 0, e.g. truncated or masked at termination) takes no part in
        its group's statistics and gets advantage 0; one whose steps disagree counts as trained
        (its untrained steps get the advantage times their zero mask: nothing)."""
        for step in self.steps:
            mask = step.response_mask
            if mask is None:
                if len(step.response_ids):
                    return True
            elif bool(mask.any()) if isinstance(mask, Tensor) else any(mask):
                return True
        return False


@dataclass(slots=True, eq=False)
class TrajectoryGroup:
    """Trajectories whose rewards are compared with each other (one task, one role).

    Attributes:
        trajectories: the members, the same objects as in the episodes (not copies).
        group_id: a label for logs, e.g. ``"task-7:solver"``; never parsed.
        group_role: the role, which picks the estimator (``AlgorithmConfig.estimator_map``).
            When not given: the trajectories' shared name, else ``"default"``.
        task_id: the task the group belongs to, when it has one (named in error messages).
        metadata: one dict per trajectory (``task_id``, ``rollout_idx``,
            ``termination_reason``, ``is_correct``), as the default grouping fills it.
        reward_baseline: the reward of a greedy rollout of the same task and role, ``remax``'s
            baseline (the trainer samples it when a role's estimator is ``remax``), or None.
    """

    trajectories: list[Trajectory] = field(default_factory=list)
    group_id: str = ""
    group_role: str | None = None
    task_id: str | None = None
    metadata: list[dict] = field(default_factory=list)
    reward_baseline: float | None = None

    def __post_init__(self) -> None:
        if self.group_role is None:
            names = {t.name for t in self.trajectories}
            self.group_role = names.pop() if len(names) == 1 and "" not in names else DEFAULT_GROUP_ROLE
        if not isinstance(self.group_role, str) or not self.group_role:
            raise InvalidTrajectoryError(
                f"group_role of group {self.group_id!r} must be a non-empty str, got {self.group_role!r}."
            )


@dataclass(slots=True, eq=False)
class Episode:
    """One rollout of one task: the trajectories of every agent that took part.

    Attributes:
        id: a unique episode id; defaults to ``"{task_id}:{rollout_idx}"`` (built, never parsed).
        task: the task itself (a dict, a prompt, ...).
        task_id: the task's id; episodes with the same ``task_id`` are rollouts of one task.
        rollout_idx: which rollout of the task this is.
        trajectories: the trajectories.
        is_correct: whether the episode solved the task.
        termination_reason: why it ended; a :class:`TerminationReason` or its string value.
        metrics: numbers the workflow reports.
        info: free-form metadata (``"data_source"`` is used by validation).

    Raises:
        ValueError: ``termination_reason`` is a string that is not a TerminationReason value.
    """

    id: str = ""
    task: Any = None
    task_id: str | None = None
    rollout_idx: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)
    is_correct: bool = False
    termination_reason: TerminationReason | None = None
    metrics: dict = field(default_factory=dict)
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id and self.task_id is not None:
            self.id = f"{self.task_id}:{self.rollout_idx}"
        if isinstance(self.termination_reason, str) and not isinstance(self.termination_reason, TerminationReason):
            self.termination_reason = parse_termination_reason(self.termination_reason, f"episode {self.id!r}")


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
