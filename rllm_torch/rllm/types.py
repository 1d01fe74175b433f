"""The trajectory data model: ``Step``, ``Trajectory``, ``TrajectoryGroup``, ``Episode``,
``Action``, ``TerminationReason`` (rLLM's ``rllm.types`` and ``rllm.workflows.workflow``
types), with the fields rLLM's code reads.

As in rLLM, ids carry structure when nothing else says it: a group's role is the second part of
its ``group_id`` (``"task-7:judge"`` → ``"judge"``; ``"all_groups"`` without one) and an
episode's task id is the first part of its ``id`` (``"task-7:0"`` → ``"task-7"``). Unlike rLLM,
each can also be given explicitly (``TrajectoryGroup(group_role=...)``, ``Episode(task_id=...)``),
and then wins.

Additions: ``Step.response_mask`` (optional) says which response tokens are trained; without it
every token of ``response_ids`` is. :meth:`Step.token_advantages` turns the step's advantage into
one value per response token with that mask, which is what a backend does in broadcast mode.

The classes are plain mutable dataclasses with ``__slots__`` (cheap attribute writes: the
collector writes ``step.advantage`` on every step of a batch); rLLM's ``metadata`` is ``info``
under both names.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from torch import Tensor

from rllm_torch.core.errors import InvalidTrajectoryError
from rllm_torch.rllm.steps import (
    Action,
    MetadataAlias,
    Step,
    TerminationReason,
    parse_termination_reason,
    without_images,
)

__all__ = [
    "TerminationReason",
    "Action",
    "Step",
    "Trajectory",
    "TrajectoryGroup",
    "Episode",
    "DEFAULT_GROUP_ROLE",
    "parse_termination_reason",
]

DEFAULT_GROUP_ROLE = "all_groups"
"""Role of a :class:`TrajectoryGroup` whose ``group_id`` has no ``":role"`` part (rLLM's)."""


def role_of_group_id(group_id: str) -> str:
    """rLLM's ``TrajectoryGroup.group_role``: the part after the first ``":"`` of ``group_id`` and
    before the next (``"task-7:judge"`` → ``"judge"``), else :data:`DEFAULT_GROUP_ROLE`."""
    return group_id.split(":")[1] if ":" in group_id[:-1] else DEFAULT_GROUP_ROLE


@dataclass(slots=True, eq=False)
class Trajectory(MetadataAlias):
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
        task, signals, input, output: rLLM's fields, carried as given.
    """

    name: str = ""
    steps: list[Step] = field(default_factory=list)
    reward: float | None = None
    info: dict = field(default_factory=dict)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    reward_components: list[float] | None = None
    task: Any = None
    signals: dict = field(default_factory=dict)
    input: Any = None
    output: Any = None

    def to_dict(self) -> dict:
        """The trajectory as plain data (rLLM's ``Trajectory.to_dict`` keys)."""
        task = without_images(self.task)
        return {
            "uid": self.uid,
            "name": self.name,
            "task": task,
            "steps": [step.to_dict() for step in self.steps],
            "reward": float(self.reward) if self.reward is not None else None,
            "info": self.info,
        }

    def is_cumulative(self) -> bool:
        """Whether every step's ``chat_completions`` extends the previous step's (rLLM's check
        that a multi-turn conversation can be trained as one sequence)."""
        for prev, curr in zip(self.steps, self.steps[1:], strict=False):
            if curr.chat_completions[: len(prev.chat_completions)] != prev.chat_completions:
                return False
        return True

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
        group_id: ``"{task_id}:{role}"`` as rLLM builds it (e.g. ``"task-7:solver"``).
        group_role: the role, which picks the estimator (``AlgorithmConfig.estimator_map``).
            When not given: from ``group_id`` as rLLM reads it (:func:`role_of_group_id`:
            ``"task-7:judge"`` → ``"judge"``, ``"all_groups"`` without a ``":"``).
        task_id: the task the group belongs to; when not given, ``group_id``'s part before the
            first ``":"`` (rLLM's), else None. Named in error messages.
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
    weight_version: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.group_id, str):
            raise InvalidTrajectoryError(f"group_id must be a str, got {self.group_id!r}.")
        if self.group_role is None:
            self.group_role = role_of_group_id(self.group_id)
        if self.task_id is None and ":" in self.group_id:
            self.task_id = self.group_id.split(":")[0]
        if not isinstance(self.group_role, str) or not self.group_role:
            raise InvalidTrajectoryError(
                f"group_role of group {self.group_id!r} must be a non-empty str, got {self.group_role!r}."
            )


@dataclass(slots=True, eq=False)
class Episode(MetadataAlias):
    """One rollout of one task: the trajectories of every agent that took part.

    Attributes:
        id: the episode id, ``"{task_id}:{rollout_idx}"`` as rLLM builds it (the default when
            ``task_id`` is given; a fresh UUID when neither is).
        task: the task itself (a dict, a prompt, ...).
        task_id: the task's id; episodes with the same ``task_id`` are rollouts of one task.
            When not given: ``id``'s part before the first ``":"`` (rLLM's ``Episode.task_id``).
        rollout_idx: which rollout of the task this is (from ``id``'s second part when that is an
            integer and ``task_id`` was not given).
        trajectories: the trajectories.
        is_correct: whether the episode solved the task.
        termination_reason: why it ended; a :class:`TerminationReason` or its string value.
        metrics: numbers the workflow reports.
        info: free-form metadata (``"data_source"`` is used by validation); rLLM's ``metadata``.
        session_id, artifacts: rLLM's fields, carried as given.

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
    session_id: str | None = None
    artifacts: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{self.task_id}:{self.rollout_idx}" if self.task_id is not None else uuid.uuid4().hex
        elif self.task_id is None:  # rLLM reads the task id (and rollout index) from the id
            parts = str(self.id).split(":")
            self.task_id = parts[0]
            if len(parts) > 1 and parts[1].isdigit() and self.rollout_idx == 0:
                self.rollout_idx = int(parts[1])
        if isinstance(self.termination_reason, str) and not isinstance(self.termination_reason, TerminationReason):
            self.termination_reason = parse_termination_reason(self.termination_reason, f"episode {self.id!r}")

    def to_dict(self) -> dict:
        """The episode as plain data (rLLM's ``Episode.to_dict`` keys)."""
        task = without_images(self.task)
        reason = self.termination_reason
        return {
            "id": self.id,
            "task": task,
            "termination_reason": reason.value if isinstance(reason, Enum) else reason,
            "is_correct": bool(self.is_correct),
            "session_id": self.session_id,
            "trajectories": [t.to_dict() for t in self.trajectories],
            "metrics": self.metrics,
            "info": self.info,
        }
