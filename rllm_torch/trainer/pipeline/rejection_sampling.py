"""Rejection sampling and group filtering between the transform and the advantages (rLLM's
``apply_rejection_sampling_and_filtering``).

* mode ``"none"`` (the unified trainer's with ``rejection_sample.enable=False``): as in rLLM,
  groups with fewer than ``min_trajs_per_group`` trajectories are dropped (and counted); nothing
  else is filtered (in async training, the uniform filter below too, as rLLM's async buffer does)
  and nothing accumulates. The metrics are this batch's.
* mode ``"episode"``: groups with fewer than ``min_trajs_per_group`` trajectories are dropped,
  and with ``filter_uniform_groups`` so are groups of two or more whose raw rewards all lie within
  ``uniform_reward_tolerance`` of each other (they carry no learning signal). The kept groups and
  episodes accumulate in a :class:`RejectionSamplingState` across batches until at least
  ``min_partial_solve_tasks`` tasks are partially solved (some but not all rollouts
  ``is_correct``); then everything accumulated is returned and the state is emptied.
  Until then the call returns no groups and the trainer skips the batch. The trainer empties the
  state before every batch, as rLLM's does (``TrainerState.reset_batch``,
  rllm/trainer/unified_trainer.py), so a batch short of partial solves is dropped, unless
  ``rllm.rejection_sample.accumulate=true`` (:attr:`RejectionSamplingConfig.accumulate`) carries it on.
"""

from __future__ import annotations

import numbers
import warnings
from dataclasses import astuple, dataclass, field
from typing import Literal

import numpy as np
import torch.distributed as dist

from rllm_torch.core.checks import check_reward
from rllm_torch.core.distributed import ONE_PROCESS, gather_objects, resolve_process_group
from rllm_torch.core.errors import ConfigError, InvalidTrajectoryError
from rllm_torch.rllm.types import Episode, TrajectoryGroup
from rllm_torch.trainer.schema import RejectionSampleSection

__all__ = [
    "RejectionSamplingConfig",
    "RejectionSamplingState",
    "apply_rejection_sampling_and_filtering",
    "groups_with_signal",
    "check_refill",
]


UNIFORM_REWARD_TOLERANCE = 1e-6
"""Rewards within this distance (max - min) count as equal (the uniform filters')."""


@dataclass
class RejectionSamplingConfig:
    """Options of rejection sampling (rLLM's ``RejectionSamplingConfig``, plus the uniform filter's tolerance).

    Attributes:
        mode: ``"none"`` (drop small groups) or ``"episode"`` (filter and accumulate).
        min_trajs_per_group: groups with fewer trajectories are dropped (both modes, as in rLLM).
        min_partial_solve_tasks: partially solved tasks needed before a batch is released.
        filter_uniform_groups: drop groups that carry no learning signal: by
            ``uniform_filter_metric``, groups whose raw rewards are all equal, or whose
            trajectories are all correct or all wrong. In episode mode, and in async training
            in either mode (rLLM reads it only in its async trainer, in either mode; its sync
            trainer ignores it, so a sync episode-mode run warns at start-up).
        uniform_reward_tolerance: rewards within this distance (max − min) count as equal.
        uniform_filter_metric: ``"reward"`` (the raw trajectory rewards, within the tolerance)
            or ``"is_correct"`` (each trajectory's episode ``is_correct``, as DAPO's dynamic
            sampling filters on accuracy rather than on a shaped reward, Yu et al. 2025,
            arXiv:2503.14476; read from ``TrajectoryGroup.metadata``, which the default grouping
            fills).
        accumulate: the trainer keeps the state across batches (a batch short of partial solves
            waits for the next); False (rLLM's trainer): it empties it before every batch.
        refill_filtered_uniform_groups: rLLM's (branch ``terminal-rl``; True in its dataclass, false
            in its ``base.yaml`` and the run config here), read by its async buffer only: a group it
            drops as uniform is replaced by another task's. Nothing here reads it: a dropped group
            is never replaced (the trainer refuses ``true`` with ``filter_uniform_groups``).
        async_training: the run trains asynchronously: ``filter_uniform_groups`` applies in mode
            ``"none"`` too, as rLLM's async buffer applies it.

    Raises:
        ValueError: an unknown mode, a negative count or tolerance.
    """

    mode: Literal["none", "episode"] = "none"
    min_trajs_per_group: int = RejectionSampleSection.min_trajs_per_group
    min_partial_solve_tasks: int = RejectionSampleSection.min_partial_solve_tasks
    filter_uniform_groups: bool = RejectionSampleSection.filter_uniform_groups
    uniform_reward_tolerance: float = UNIFORM_REWARD_TOLERANCE
    uniform_filter_metric: Literal["reward", "is_correct"] = RejectionSampleSection.uniform_filter_metric
    accumulate: bool = RejectionSampleSection.accumulate
    refill_filtered_uniform_groups: bool = True
    async_training: bool = False

    @classmethod
    def from_config(cls, section: RejectionSampleSection, *, async_training: bool = False) -> RejectionSamplingConfig:
        """From the run config's ``rllm.rejection_sample`` (``enable``: episode mode) and whether
        the run trains asynchronously (``rllm.async_training.enable``).

        Warns:
            UserWarning: ``filter_uniform_groups`` in a sync episode-mode run, which rLLM's sync
                trainer ignores and this one applies.
        """
        if section.filter_uniform_groups and section.enable and not async_training:
            warnings.warn(
                "rllm.rejection_sample.filter_uniform_groups=true drops the groups without signal here; rLLM reads it "
                "only in async training (rllm.async_training.enable=true) and its sync trainer trains them: set it "
                "false for rLLM's sync behaviour.",
                UserWarning,
                stacklevel=2,
            )
        return cls(
            mode="episode" if section.enable else "none",
            min_partial_solve_tasks=section.min_partial_solve_tasks,
            min_trajs_per_group=section.min_trajs_per_group,
            filter_uniform_groups=section.filter_uniform_groups,
            uniform_filter_metric=section.uniform_filter_metric,
            accumulate=section.accumulate,
            refill_filtered_uniform_groups=getattr(section, "refill_filtered_uniform_groups", True),  # rLLM's default
            async_training=async_training,
        )

    def __post_init__(self) -> None:
        if self.mode not in ("none", "episode"):
            hint = " (rLLM's 'group' mode is not implemented there either)" if self.mode == "group" else ""
            raise ConfigError(f"rejection sampling mode must be 'none' or 'episode', got {self.mode!r}{hint}.")
        for name in ("min_trajs_per_group", "min_partial_solve_tasks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"RejectionSamplingConfig.{name} must be a non-negative int, got {value!r}.")
        for name in ("filter_uniform_groups", "accumulate", "refill_filtered_uniform_groups", "async_training"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"RejectionSamplingConfig.{name} must be a bool, got {getattr(self, name)!r}.")
        if self.uniform_filter_metric not in ("reward", "is_correct"):
            raise ConfigError(
                f"uniform_filter_metric must be 'reward' or 'is_correct', got {self.uniform_filter_metric!r}."
            )
        tol = self.uniform_reward_tolerance
        if isinstance(tol, bool) or not isinstance(tol, numbers.Real) or not tol >= 0:
            raise ConfigError(f"uniform_reward_tolerance must be a non-negative number, got {tol!r}.")


def check_refill(section: RejectionSampleSection) -> None:
    """The run config's ``rllm.rejection_sample``: rLLM ``terminal-rl``'s ``refill_filtered_uniform_groups``
    (read by its async buffer, rllm/trainer/buffer.py) with the uniform filter on.

    Raises:
        ConfigError: ``refill_filtered_uniform_groups=true`` with ``filter_uniform_groups=true``:
            rLLM replaces each group it drops as uniform with another task's; here none is replaced.
    """
    if section.filter_uniform_groups and section.refill_filtered_uniform_groups:
        raise ConfigError(
            "rllm.rejection_sample.refill_filtered_uniform_groups=true: rLLM's async trainer replaces each group it drops "
            "as uniform with another task's; here a dropped group is not replaced (the step trains on the others): set "
            "it false, or fill each step with groups that have signal with rllm.algorithm.filter_groups.enable=true."
        )


@dataclass
class _Counts:
    solve_none: int = 0
    solve_all: int = 0
    solve_partial: int = 0
    groups_before_filter: int = 0
    groups_after_filter: int = 0
    groups_dropped_insufficient_trajs: int = 0
    groups_dropped_uniform: int = 0

    def to_metrics(self, prefix: str = "batch", group: dist.ProcessGroup | None = None) -> dict[str, float]:
        """The metrics of these counts summed over every rank of ``group`` (None: this process's)."""
        if group is not None:
            summed = [sum(values) for values in zip(*gather_objects(astuple(self), group), strict=True)]
            return _Counts(*summed).to_metrics(prefix)
        tasks = self.solve_none + self.solve_all + self.solve_partial
        per_task = max(tasks, 1)
        return {
            f"{prefix}/num_tasks": float(tasks),
            f"{prefix}/solve_none": self.solve_none / per_task,
            f"{prefix}/solve_all": self.solve_all / per_task,
            f"{prefix}/solve_partial": self.solve_partial / per_task,
            f"{prefix}/groups_before_filter": float(self.groups_before_filter),
            f"{prefix}/groups_after_filter": float(self.groups_after_filter),
            f"{prefix}/groups_dropped_insufficient_trajs": float(self.groups_dropped_insufficient_trajs),
            f"{prefix}/fraction_groups_dropped_uniform": self.groups_dropped_uniform
            / max(self.groups_before_filter, 1),
        }


@dataclass
class RejectionSamplingState:
    """What episode mode carries from batch to batch: the groups and episodes kept so far and
    their counts. Keep one per training run (the unified trainer keeps it in its TrainerState)."""

    accumulated_groups: list[TrajectoryGroup] = field(default_factory=list)
    accumulated_episodes: list[Episode] = field(default_factory=list)
    counts: _Counts = field(default_factory=_Counts)

    def reset(self) -> None:
        """Forget everything accumulated."""
        self.accumulated_groups, self.accumulated_episodes, self.counts = [], [], _Counts()


def _group_rewards(group: TrajectoryGroup) -> list[float]:
    rewards = []
    for position, traj in enumerate(group.trajectories):
        where = f"task {group.task_id!r}, trajectory {traj.name!r} (position {position} of group {group.group_id!r})"
        rewards.append(check_reward(traj.reward, where))
    return rewards


def _filter_groups(
    groups: list[TrajectoryGroup], config: RejectionSamplingConfig, counts: _Counts
) -> tuple[list[TrajectoryGroup], set[str]]:
    kept, dropped_uids = [], set()
    counts.groups_before_filter += len(groups)
    # rLLM's sync mode none: sizes only; its async buffer filters in either mode
    uniform = config.filter_uniform_groups and (config.mode == "episode" or config.async_training)
    for group in groups:
        size = len(group.trajectories)
        if size < config.min_trajs_per_group:
            counts.groups_dropped_insufficient_trajs += 1
        elif uniform and size >= 2 and _is_uniform(group, config):
            counts.groups_dropped_uniform += 1
        else:
            kept.append(group)
            continue
        dropped_uids.update(t.uid for t in group.trajectories)
    counts.groups_after_filter += len(kept)
    return kept, dropped_uids


def _without(episodes: list[Episode], dropped_uids: set[str]) -> list[Episode]:
    """``episodes`` themselves, each left with the trajectories whose ``uid`` is in no dropped group
    (the caller's episodes change; one left with none stays): rLLM's ``filter_episodes``
    (rllm/trainer/algorithms/rejection_sampling.py)."""
    for episode in episodes:
        episode.trajectories = [t for t in episode.trajectories if t.uid not in dropped_uids]
    return list(episodes)


def groups_with_signal(groups: list[TrajectoryGroup], config: RejectionSamplingConfig) -> list[TrajectoryGroup]:
    """The groups that carry a learning signal: two or more trajectories not all scored alike by
    ``config.uniform_filter_metric`` (within ``uniform_reward_tolerance`` for ``"reward"``).

    Raises:
        ValueError: see :func:`apply_rejection_sampling_and_filtering` (a reward that is not a
            number; ``is_correct`` missing from a group's metadata).
    """
    return [g for g in groups if len(g.trajectories) >= 2 and not _is_uniform(g, config)]


def _is_uniform(group: TrajectoryGroup, config: RejectionSamplingConfig) -> bool:
    if config.uniform_filter_metric == "is_correct":
        return len(set(_group_correctness(group))) == 1
    rewards = _group_rewards(group)
    return max(rewards) - min(rewards) <= config.uniform_reward_tolerance


def _group_correctness(group: TrajectoryGroup) -> list[bool]:
    """Each trajectory's ``is_correct`` from the group's metadata (a clear error when absent)."""
    metadata = group.metadata
    values = [m.get("is_correct") if isinstance(m, dict) else None for m in metadata]
    if len(metadata) != len(group.trajectories) or any(not isinstance(v, (bool, np.bool_)) for v in values):
        position = next((i for i, v in enumerate(values) if not isinstance(v, (bool, np.bool_))), len(values))
        raise InvalidTrajectoryError(
            f"task {group.task_id!r}, group {group.group_id!r}: trajectory at position {position} has no is_correct "
            f"(metadata {metadata[position] if position < len(metadata) else 'missing'!r}); uniform_filter_metric='is_correct' "
            "reads TrajectoryGroup.metadata[i]['is_correct'], which the default grouping fills from Episode.is_correct. "
            "Fill it in your grouping hook, or use uniform_filter_metric='reward'."
        )
    return [bool(v) for v in values]


def _count_solves(episodes: list[Episode], counts: _Counts) -> None:
    correct_by_task: dict[object, list[bool]] = {}
    for episode in episodes:
        if episode.trajectories:
            correct_by_task.setdefault(episode.task_id, []).append(bool(episode.is_correct))
    for correct in correct_by_task.values():
        if all(correct):
            counts.solve_all += 1
        elif any(correct):
            counts.solve_partial += 1
        else:
            counts.solve_none += 1


def apply_rejection_sampling_and_filtering(
    episodes: list[Episode],
    groups: list[TrajectoryGroup],
    config: RejectionSamplingConfig,
    state: RejectionSamplingState | None = None,
    *,
    process_group: object = ONE_PROCESS,
) -> tuple[list[TrajectoryGroup], list[Episode], dict[str, float]]:
    """Filter groups and, in episode mode, accumulate them until enough tasks are partially solved.

    Args:
        episodes: the batch's episodes (``task_id`` and ``is_correct`` give the solve metrics).
        groups: the batch's groups, from :func:`transform_episodes_to_trajectory_groups`.
        config: see :class:`RejectionSamplingConfig` and the module docstring.
        state: required in episode mode, the same object from batch to batch.
        process_group: ``ONE_PROCESS`` (default), or a ``ProcessGroup`` whose ranks each hold part
            of the batch: every rank filters its own groups and the metrics count every rank's
            (one ``all_gather_object``; every rank must call). Episode mode accumulates per rank.

    Returns:
        ``(groups, episodes, metrics)``. The episodes are the caller's, each left holding only the
        trajectories of kept groups (matched by ``uid``), as rLLM's ``filter_episodes`` leaves them;
        an episode left with none is returned too. Metrics (Python
        floats): ``batch/num_tasks``, ``batch/solve_{none,all,partial}`` (fractions of tasks, by
        ``task_id``, over episodes that still have a trajectory), ``batch/groups_before_filter``,
        ``batch/groups_after_filter``, ``batch/groups_dropped_insufficient_trajs``,
        ``batch/fraction_groups_dropped_uniform``; in episode mode they count everything
        accumulated since the last release.

    Raises:
        ValueError: episode mode without a state; the uniform filter meets a reward that is not a number.

    Source: rLLM ``rllm/trainer/algorithms/rejection_sampling.py`` (mode ``none`` drops the groups
    below ``min_trajs_per_group`` there too).
    """
    group = resolve_process_group(process_group)
    if config.mode == "none":
        counts = _Counts()
        kept, dropped_uids = _filter_groups(groups, config, counts)
        kept_episodes = _without(episodes, dropped_uids)
        _count_solves(kept_episodes, counts)
        return kept, kept_episodes, counts.to_metrics(group=group)
    if state is None:
        raise ConfigError(
            "episode-mode rejection sampling needs a RejectionSamplingState kept from batch to batch; pass state=RejectionSamplingState() once and reuse it."
        )
    counts = state.counts
    kept, dropped_uids = _filter_groups(groups, config, counts)
    kept_episodes = _without(episodes, dropped_uids)
    _count_solves(kept_episodes, counts)
    state.accumulated_groups.extend(kept)
    state.accumulated_episodes.extend(kept_episodes)
    metrics = counts.to_metrics(group=group)
    if counts.solve_partial < config.min_partial_solve_tasks:
        return [], [], metrics
    released = (state.accumulated_groups, state.accumulated_episodes)
    state.reset()
    return released[0], released[1], metrics
