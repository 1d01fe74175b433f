"""One role's inputs to the per-role rule (:mod:`~rllm_torch.rllm.role_plan`; which estimator a
role runs is its :class:`~rllm_torch.rllm.plan.RolePlan`): what its estimator takes besides the
rewards (:func:`estimator_inputs`: rLLM's ``traj_groups``, greedy baselines), the trajectories'
reward components and the groups' baselines as tensors, and the warning for role maps naming
roles no batch has (:func:`unseen_map_roles`).
"""

from __future__ import annotations

import math
from enum import Enum
from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.checks import check_reward
from rllm_torch.core.distributed import agree_across_ranks
from rllm_torch.core.errors import ConfigError, InvalidRewardsError
from rllm_torch.rllm.bound_estimator import BoundEstimator
from rllm_torch.rllm.config import AlgorithmConfig, rLLMAdvantageEstimator
from rllm_torch.rllm.types import Trajectory, TrajectoryGroup

__all__ = [
    "reward_components_tensor",
    "group_baselines_tensor",
    "unseen_map_roles",
    "role_traj_groups",
    "estimator_inputs",
]


def _label(name: rLLMAdvantageEstimator | str) -> str:
    return name.value if isinstance(name, Enum) else name


def reward_components_tensor(trajectories: list[tuple[TrajectoryGroup, Trajectory]]) -> Tensor | None:
    """``[N, R]`` float64 of the trajectories' ``reward_components`` (``(group, trajectory)``
    pairs, in order), or None when none has any.

    Raises:
        InvalidRewardsError: some have them and others not, or their lengths differ; the first
            such trajectory is named with its task and group.
    """
    first = trajectories[0][1].reward_components if trajectories else None
    for group, traj in trajectories:
        if (traj.reward_components is None) != (first is None) or len(traj.reward_components or []) != len(first or []):
            raise InvalidRewardsError(
                f"task {group.task_id!r}, group {group.group_id!r}, trajectory {traj.name!r}: reward_components "
                f"{traj.reward_components!r}, where the first trajectory has {first!r}; every trajectory of a batch "
                "carries the same reward functions' rewards (Trajectory.reward_components), or none does."
            )
    if first is None:
        return None
    return torch.tensor([t.reward_components for _, t in trajectories], dtype=torch.float64).reshape(
        len(trajectories), -1
    )


def group_baselines_tensor(groups: list[TrajectoryGroup]) -> Tensor | None:
    """``[G]`` float64 of the groups' ``reward_baseline`` (``remax``'s greedy rewards), NaN for a
    group without one; None when no group has one.

    Raises:
        InvalidRewardTypeError / InvalidRewardsError: a baseline that is not a real number, or not
            finite, naming the task and group.
    """
    if all(group.reward_baseline is None for group in groups):
        return None
    values = []
    for g in groups:
        value = math.nan
        if g.reward_baseline is not None:
            value = check_reward(g.reward_baseline, f"task {g.task_id!r}, group {g.group_id!r}: reward_baseline")
            if not math.isfinite(value):
                raise InvalidRewardsError(
                    f"task {g.task_id!r}, group {g.group_id!r}: reward_baseline {value} is not finite; remax's baseline is "
                    "the reward of a greedy rollout, a real number (leave it None where there is none)."
                )
        values.append(value)
    return torch.tensor(values, dtype=torch.float64).reshape(len(groups))


def role_traj_groups(batch: Any, role: str, rows_N: Tensor | None) -> list | None:
    """rLLM's ``traj_groups`` of a role: each of its RL groups as a ``TrajectoryGroup`` holding
    exactly the trajectories the estimator's arrays hold (the trained ones, in order), so that
    ``traj_groups[i].trajectories[j]`` is the trajectory of ``rewards[i][j]``. A group's
    trajectories are contiguous in the batch's flat order, in the group's own order."""
    from rllm_torch.rllm.types import TrajectoryGroup

    if batch.trajectory_groups is None:
        return None
    groups = batch.rl_groups(role)
    if rows_N is None:
        return [batch.trajectory_groups[g] for g in groups]
    kept = set(rows_N.tolist())
    counts = torch.bincount(batch.group_index, minlength=batch.num_groups).tolist()
    firsts = [sum(counts[:g]) for g in range(batch.num_groups)]
    views = []
    for g in groups:
        source = batch.trajectory_groups[g]
        members = [j for j in range(counts[g]) if firsts[g] + j in kept]
        views.append(
            TrajectoryGroup(
                [source.trajectories[j] for j in members],
                group_id=source.group_id,
                group_role=source.group_role,
                task_id=source.task_id,
                metadata=[source.metadata[j] for j in members] if len(source.metadata) == counts[g] else [],
                reward_baseline=source.reward_baseline,
            )
        )
    return views


def estimator_inputs(
    batch: Any, role: str, estimator: BoundEstimator, process_group: object, rows_N: Tensor | None = None
) -> dict[str, object] | None:
    """What ``estimator`` takes besides the rewards and options: rLLM's ``traj_groups`` (when it
    takes them and the caller has groups) and, when it needs ``baselines`` (``remax``), the role's
    groups' greedy rewards. A group without one is refused (one host sync; under a process group
    one ``all_gather_object``, so every rank raises)."""
    inputs: dict[str, object] = {}
    if estimator.takes_traj_groups and (views := role_traj_groups(batch, role, rows_N)) is not None:
        inputs["traj_groups"] = views
    if "baselines" not in estimator.needs:
        return inputs or None
    groups = batch.rl_groups(role)
    baselines_G = batch.group_baselines[groups] if batch.group_baselines is not None else None
    missing = len(groups) if baselines_G is None else int(baselines_G.isnan().sum())
    error = None
    if missing:
        error = ConfigError(
            f"role {role!r}: {estimator.name}'s baseline is each group's greedy reward "
            f"(TrajectoryGroup.reward_baseline), and {missing} of the role's {len(groups)} group(s) have none. The trainer "
            "samples them for a role whose estimator needs baselines; a caller of the collector sets reward_baseline on "
            "every group."
        )
    if process_group is not None:
        agree_across_ranks(process_group, error, {}, must_match=())
    elif error is not None:
        raise error
    return inputs | {"baselines": baselines_G}


def unseen_map_roles(algorithm_config: AlgorithmConfig, roles: set[str]) -> str:
    """A warning naming the roles of ``estimator_map`` / ``loss_fn_map`` that none of ``roles``
    (a batch's group roles, every rank's) is: likely misspelt, since their entries change
    nothing; ``""`` when every entry's role was seen."""
    unseen = sorted((set(algorithm_config.estimator_map) | set(algorithm_config.loss_fn_map)) - roles)
    if not unseen:
        return ""
    return (
        f"rllm.algorithm.estimator_map / loss_fn_map name role(s) {unseen} that no group of the first batch has "
        f"(its roles: {sorted(roles)}); their entries change nothing unless such groups come later. Check the spelling."
    )
