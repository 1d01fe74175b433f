"""ReMax's baselines: the reward of one greedy rollout of each task, attached to the task's
trajectory groups (``TrajectoryGroup.reward_baseline``) for the per-role rule to subtract."""

from __future__ import annotations

from typing import Any

from rllm_torch.rllm.plan import AdvantagePlan
from rllm_torch.rllm.types import Episode, TrajectoryGroup
from rllm_torch.trainer.pipeline.transform import (
    TrajGroupingHook,
    TransformConfig,
    transform_episodes_to_trajectory_groups,
)
from rllm_torch.trainer.ranks import RunRanks

__all__ = ["sample_greedy_episodes", "attach_reward_baselines"]


async def sample_greedy_episodes(backend: Any, engine: Any, batch: Any, *, step: int, epoch: int) -> list[Episode]:
    """The backend's greedy rollout of each task of ``batch``
    (``BackendProtocol.generate_baseline_episodes``), logged as step ``step``'s ``baseline`` episodes."""
    engine.set_training_step(step, mode="baseline", epoch=epoch)
    try:
        return await backend.generate_baseline_episodes(batch, agent_workflow_engine=engine)
    finally:
        engine.set_training_step(step, mode="train", epoch=epoch)


def attach_reward_baselines(
    groups: list[TrajectoryGroup],
    greedy_episodes: list[Episode],
    plan: AdvantagePlan,
    transform_config: TransformConfig,
    traj_grouping_hook: TrajGroupingHook | None = None,
    ranks: RunRanks | None = None,
) -> tuple[list[TrajectoryGroup], dict[str, float]]:
    """Set each group's ``reward_baseline`` to the mean reward of the greedy episodes' group with
    the same ``group_id`` (one trajectory per task and role: its reward), in place; a group that
    has one keeps it (rejection sampling's from an earlier step). The greedy episodes are grouped
    as the training ones (the same transform and hook), without compact filtering: a greedy
    rollout that was cut off still scores the prompt.

    Returns:
        ``(groups, metrics)``: the groups, less those of a ``remax`` role left without a baseline
        (their greedy episode failed, recorded as an error with ``rllm.workflow.raise_on_error=false``,
        or has no reward); ``batch/remax_groups_without_baseline`` (how many were left out) and
        ``batch/remax_greedy_reward`` (the mean baseline), over every rank of ``ranks``.
    """
    greedy, _ = transform_episodes_to_trajectory_groups(
        greedy_episodes, transform_config, None, metrics_prefix="baseline", traj_grouping_hook=traj_grouping_hook
    )
    rewards = {
        g.group_id: sum(float(t.reward) for t in g.trajectories) / len(g.trajectories)
        for g in greedy
        if g.trajectories and all(t.reward is not None for t in g.trajectories)
    }
    kept, needs_one = [], {role: "baselines" in plan.role(role).needs for role in {g.group_role for g in groups}}
    for group in groups:
        if group.group_id in rewards and group.reward_baseline is None:
            group.reward_baseline = rewards[group.group_id]
        if group.reward_baseline is not None or not needs_one[group.group_role]:
            kept.append(group)
    baselines = [g.reward_baseline for g in kept if g.reward_baseline is not None]
    values = [sum(baselines), float(len(baselines)), float(len(groups) - len(kept))]
    total, count, dropped = ranks.reduce(values) if ranks is not None else values
    metrics = {"batch/remax_groups_without_baseline": dropped}
    if count:
        metrics["batch/remax_greedy_reward"] = total / count
    return kept, metrics
