"""Episodes → trajectory groups (rLLM's ``transform_episodes_to_trajectory_groups``).

The pipeline: (1) name unnamed trajectories by their position in the episode; (2) the grouping
hook builds the groups: by default one group per (task id, trajectory name), leaving out
episodes that compact filtering masks, and in broadcast mode giving a trajectory without a
reward its last step's reward; (3) the ``groups/*`` metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch.distributed as dist

from rllm_torch.core.distributed import ONE_PROCESS, gather_objects, resolve_process_group
from rllm_torch.core.errors import InvalidTrajectoryError
from rllm_torch.rllm.types import Episode, TrajectoryGroup
from rllm_torch.trainer.pipeline.compact_filtering import CompactFilteringConfig

__all__ = [
    "TransformConfig",
    "transform_episodes_to_trajectory_groups",
    "default_traj_grouping_hook",
    "build_trajectory_groups",
    "propagate_trajectory_rewards",
    "TrajGroupingHook",
]

TrajGroupingHook = Callable[[list[Episode], "TransformConfig", "CompactFilteringConfig | None"], list[TrajectoryGroup]]


@dataclass
class TransformConfig:
    """Options of the episode → group transform (rLLM's ``TransformConfig``).

    Attributes:
        impute_missing_names: name an unnamed trajectory ``f"{default_traj_name}_{position}"``.
        default_traj_name: a trajectory with this name (or an empty one) counts as unnamed.
        drop_unnamed_traj: when not imputing, drop unnamed trajectories instead of keeping them.
        broadcast: trajectory-level rewards (the unified trainer's mode). When False, the
            trajectories of a group must have the same number of steps.
    """

    impute_missing_names: bool = True
    default_traj_name: str = "default_traj_name"
    drop_unnamed_traj: bool = False
    broadcast: bool = True


def _impute_trajectory_names(episodes: list[Episode], config: TransformConfig) -> None:
    """Name unnamed trajectories by position, in place (or drop them, per ``config``)."""
    for episode in episodes:
        kept = []
        for position, trajectory in enumerate(episode.trajectories):
            if not trajectory.name or trajectory.name == config.default_traj_name:
                if config.impute_missing_names:
                    trajectory.name = f"{config.default_traj_name}_{position}"
                elif config.drop_unnamed_traj:
                    continue
            kept.append(trajectory)
        if len(kept) != len(episode.trajectories):
            episode.trajectories = kept


def build_trajectory_groups(
    episodes: list[Episode], compact_filtering_config: CompactFilteringConfig | None = None
) -> list[TrajectoryGroup]:
    """One group per (task id, trajectory name), in order of first appearance.

    Episodes that ``compact_filtering_config`` masks and trajectories with no step are left out.
    The groups hold the episodes' trajectory objects (not copies); ``group_role`` is the
    trajectory name, ``task_id`` the episodes' task id, ``group_id`` ``f"{task_id}:{name}"``
    (a label only).

    Raises:
        ValueError: an episode has no ``task_id``.
    """
    by_key: dict[tuple, TrajectoryGroup] = {}
    for episode in episodes:
        if compact_filtering_config is not None and compact_filtering_config.should_mask(episode.termination_reason):
            continue
        if episode.task_id is None:
            raise InvalidTrajectoryError(
                f"episode {episode.id!r} has no task_id; set Episode.task_id (rollouts of one task share it) so its trajectories can be grouped."
            )
        for trajectory in episode.trajectories:
            if not trajectory.steps:
                continue
            key = (episode.task_id, trajectory.name)
            group = by_key.get(key)
            if group is None:
                group = by_key[key] = TrajectoryGroup(
                    [],
                    group_id=f"{episode.task_id}:{trajectory.name}",
                    group_role=trajectory.name or "default",
                    task_id=episode.task_id,
                )
            group.trajectories.append(trajectory)
            group.metadata.append(
                {
                    "task_id": episode.task_id,
                    "rollout_idx": episode.rollout_idx,
                    "termination_reason": episode.termination_reason,
                    "is_correct": episode.is_correct,
                }
            )
    return list(by_key.values())


def propagate_trajectory_rewards(groups: list[TrajectoryGroup], config: TransformConfig) -> None:
    """Broadcast mode: a trajectory without a reward takes its last step's reward (in place).

    Raises:
        ValueError: a group mixes trajectories with and without a reward (naming the task, the
            group and the first trajectory of each kind), or, when ``config.broadcast`` is False,
            the trajectories of a group have different numbers of steps.
    """
    for group in groups:
        if not config.broadcast:
            counts = {len(t.steps) for t in group.trajectories}
            if len(counts) > 1:
                raise InvalidTrajectoryError(
                    f"task {group.task_id!r}, group {group.group_id!r}: trajectories have {sorted(counts)} steps; per-step mode needs the same number in a group."
                )
            continue
        missing = [t for t in group.trajectories if t.reward is None]
        if not missing:
            continue
        if len(missing) != len(group.trajectories):
            rewarded = next(t for t in group.trajectories if t.reward is not None)
            raise InvalidTrajectoryError(
                f"task {group.task_id!r}, group {group.group_id!r}: trajectory {missing[0].name!r} (uid {missing[0].uid}) has no reward but "
                f"trajectory {rewarded.name!r} (uid {rewarded.uid}) has one; set a reward on every trajectory of the group or on none (then each takes its last step's reward)."
            )
        for trajectory in missing:
            trajectory.reward = trajectory.steps[-1].reward


def default_traj_grouping_hook(
    episodes: list[Episode],
    transform_config: TransformConfig,
    compact_filtering_config: CompactFilteringConfig | None = None,
) -> list[TrajectoryGroup]:
    """The default grouping: :func:`build_trajectory_groups` then :func:`propagate_trajectory_rewards`."""
    groups = build_trajectory_groups(episodes, compact_filtering_config)
    propagate_trajectory_rewards(groups, transform_config)
    return groups


def _transform_metrics(
    episodes: list[Episode], groups: list[TrajectoryGroup], prefix: str, group: dist.ProcessGroup | None
) -> dict[str, float]:
    sizes = [len(g.trajectories) for g in groups]
    mine = (
        sum(len(e.trajectories) for e in episodes),
        sum(sizes),
        len(sizes),
        max(sizes, default=0),
        min(sizes, default=None),
    )
    parts = gather_objects(mine, group)  # every rank's counts: the metrics are the global batch's
    before, after, num_groups = (sum(p[i] for p in parts) for i in range(3))
    smallest = [p[4] for p in parts if p[4] is not None]
    return {
        f"{prefix}/num_trajs_before_filter": float(before),
        f"{prefix}/num_trajs_after_filter": float(after),
        f"{prefix}/num_groups": float(num_groups),
        f"{prefix}/avg_group_size": after / num_groups if num_groups else 0.0,
        f"{prefix}/max_group_size": float(max(p[3] for p in parts)),
        f"{prefix}/min_group_size": float(min(smallest, default=0)),
    }


def transform_episodes_to_trajectory_groups(
    episodes: list[Episode],
    transform_config: TransformConfig | None = None,
    compact_filtering_config: CompactFilteringConfig | None = None,
    metrics_prefix: str = "groups",
    traj_grouping_hook: TrajGroupingHook | None = None,
    *,
    process_group: object = ONE_PROCESS,
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Turn episodes into trajectory groups for advantage computation.

    Rollouts of one task are one group per trajectory name, whatever their uids. Unnamed
    trajectories are named (in place) before the hook runs.

    Args:
        episodes: the batch's episodes; their trajectories are named and rewarded in place.
        transform_config: defaults to ``TransformConfig()``.
        compact_filtering_config: reasons for which episodes are left out (None: none).
        metrics_prefix: prefix of the metric names.
        traj_grouping_hook: ``hook(episodes, transform_config, compact_filtering_config) ->
            list[TrajectoryGroup]``, replacing :func:`default_traj_grouping_hook`.
        process_group: ``ONE_PROCESS`` (default), or a ``ProcessGroup`` whose ranks each hold
            part of the batch: groups are built from this rank's episodes, the metrics count
            every rank's (one ``all_gather_object``; every rank must call).

    Returns:
        ``(groups, metrics)``; metrics (Python floats): ``{prefix}/num_trajs_before_filter``
        (trajectories in all episodes), ``num_trajs_after_filter`` (in the groups),
        ``num_groups``, ``avg_group_size``, ``max_group_size``, ``min_group_size`` (0 when there
        is no group).

    Raises:
        ValueError: see :func:`build_trajectory_groups` and :func:`propagate_trajectory_rewards`.
        TypeError: the hook returned something other than a list of TrajectoryGroup.

    Source: rLLM ``rllm/experimental/common/transform.py``.
    """
    group = resolve_process_group(process_group)
    transform_config = TransformConfig() if transform_config is None else transform_config
    _impute_trajectory_names(episodes, transform_config)
    hook = default_traj_grouping_hook if traj_grouping_hook is None else traj_grouping_hook
    groups = hook(episodes, transform_config, compact_filtering_config)
    if not isinstance(groups, list) or not all(isinstance(g, TrajectoryGroup) for g in groups):
        raise TypeError(
            f"traj_grouping_hook {getattr(hook, '__name__', hook)!r} must return a list of TrajectoryGroup, got {type(groups).__name__}."
        )
    return groups, _transform_metrics(episodes, groups, metrics_prefix, group)
