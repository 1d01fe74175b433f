"""ReMax's baselines: the reward of one greedy rollout of each task, attached to the task's
trajectory groups (``TrajectoryGroup.reward_baseline``) for the per-role rule to subtract."""

from __future__ import annotations

from typing import Any

from rllm_torch.rllm.types import Episode, TrajectoryGroup
from rllm_torch.trainer.pipeline.transform import (
    TrajGroupingHook,
    TransformConfig,
    transform_episodes_to_trajectory_groups,
)

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
    transform_config: TransformConfig,
    traj_grouping_hook: TrajGroupingHook | None = None,
) -> None:
    """Set each group's ``reward_baseline`` to the mean reward of the greedy episodes' group with
    the same ``group_id`` (one trajectory per task and role: its reward), in place; a group with no
    greedy counterpart (or one without a reward) keeps ``None`` (the per-role rule then refuses
    it), and one that has a baseline keeps it. The greedy episodes are
    grouped as the training ones (the same transform and hook), without compact filtering: a
    greedy rollout that was cut off still scores the prompt."""
    greedy, _ = transform_episodes_to_trajectory_groups(
        greedy_episodes, transform_config, None, metrics_prefix="baseline", traj_grouping_hook=traj_grouping_hook
    )
    rewards = {
        g.group_id: sum(float(t.reward) for t in g.trajectories) / len(g.trajectories)
        for g in greedy
        if g.trajectories and all(t.reward is not None for t in g.trajectories)
    }
    for group in groups:  # a group kept from an earlier step (rejection sampling) keeps its own
        if group.group_id in rewards and group.reward_baseline is None:
            group.reward_baseline = rewards[group.group_id]
