"""Trajectories with no trained token (every step's response mask all 0) take no part in their
group's statistics and get advantage 0, on every path: the tensor API (``from_padded`` with a
mask), the collector and the trainer's backend batch; a group left with one trained member
follows the singleton rule, a fully masked group gives zeros; a trajectory with some trained
step counts as trained."""

from __future__ import annotations

import pytest
import torch

from rllm_torch import (
    AlgorithmConfig,
    GroupedRewards,
    Step,
    Trajectory,
    TrajectoryGroup,
    collect_reward_and_advantage_from_trajectory_groups,
    compute_advantages,
)
from rllm_torch.trainer import compute_token_advantages
from rllm_torch.trainer.pipeline.token_batch import build_token_batch

ON, OFF = [1, 1], [0, 0]


def _traj(reward, *masks, role="solver"):
    steps = [Step(prompt_ids=[1], response_ids=[2, 3], response_mask=list(m)) for m in masks]
    return Trajectory(name=role, reward=reward, steps=steps)


def _groups():
    """task a: 4 members, one untrained (reward 5: if it counted, every advantage would move);
    task b: one trained member left (singleton rule); task c: every member untrained;
    task d (role judge): a two-step trajectory trained only in its second step, and an untrained one."""
    return [
        TrajectoryGroup([_traj(1.0, ON), _traj(0.0, ON), _traj(5.0, OFF), _traj(0.5, [0, 1])], "a:solver", task_id="a"),
        TrajectoryGroup([_traj(0.7, ON), _traj(9.0, OFF, OFF)], "b:solver", task_id="b"),
        TrajectoryGroup([_traj(3.0, OFF), _traj(4.0, OFF)], "c:solver", task_id="c"),
        TrajectoryGroup(
            [_traj(1.0, OFF, ON, role="judge"), _traj(0.0, ON, role="judge"), _traj(8.0, OFF, role="judge")],
            "d:judge",
            task_id="d",
        ),
    ]


def _expected(estimator):
    """Per trajectory, in group order: the estimator on the trained members only, 0 for the others."""
    solver = GroupedRewards.from_groups([[1.0, 0.0, 0.5], [0.7]])
    solver_adv = compute_advantages(solver, estimator)[0].tolist()
    judge_adv = compute_advantages(GroupedRewards.from_groups([[1.0, 0.0]]), estimator)[0].tolist()
    a, b = solver_adv[:3], solver_adv[3:]
    return [a[0], a[1], 0.0, a[2], b[0], 0.0, 0.0, 0.0, judge_adv[0], judge_adv[1], 0.0]


ESTIMATORS = ["grpo", "rloo", "reinforce_plus_plus_baseline"]


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_the_collector_leaves_untrained_trajectories_out_and_gives_them_zero(estimator):
    groups = _groups()
    metrics = collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator=estimator))
    got = [t.steps[0].advantage for g in groups for t in g.trajectories]
    assert got == pytest.approx(_expected(estimator), abs=1e-12)
    assert all(s.advantage == t.steps[0].advantage for g in groups for t in g.trajectories for s in t.steps)
    assert metrics["advantage/solver/num_untrained"] == 4.0 and metrics["advantage/judge/num_untrained"] == 1.0
    assert metrics["reward/solver/max"] == 1.0  # the untrained 5.0 and 9.0 are not read


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_the_backend_batch_leaves_untrained_trajectories_out_and_gives_them_zero(estimator):
    batch = build_token_batch(_groups(), pad_token_id=0)
    metrics = compute_token_advantages(batch, AlgorithmConfig(estimator=estimator))
    per_traj = torch.zeros(batch.rewards.shape[0], dtype=torch.float64)
    per_traj.index_add_(0, batch.row_index, batch.advantages.double().sum(-1))
    trained_tokens = torch.zeros_like(per_traj).index_add_(0, batch.row_index, batch.response_mask.double().sum(-1))
    got = torch.where(trained_tokens > 0, per_traj / trained_tokens.clamp(min=1), per_traj)
    torch.testing.assert_close(got, torch.tensor(_expected(estimator), dtype=torch.float64), rtol=1e-6, atol=1e-6)
    assert metrics["advantage/solver/num_untrained"] == 4.0 and metrics["advantage/judge/num_untrained"] == 1.0


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_the_tensor_api_leaves_masked_slots_out(estimator):
    """The tensor form of the same rule: a padded [G, K] batch with a mask of the trained members."""
    rewards = torch.tensor([[1.0, 0.0, 5.0, 0.5], [0.7, 9.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True], [True, False, False, False]])
    adv, _ = compute_advantages(GroupedRewards.from_padded(rewards, mask), estimator)
    want = compute_advantages(GroupedRewards.from_groups([[1.0, 0.0, 0.5], [0.7]]), estimator)[0]
    torch.testing.assert_close(adv, want)


def test_a_group_with_one_trained_member_follows_the_singleton_rule():
    groups = [TrajectoryGroup([_traj(0.7, ON), _traj(9.0, OFF)], "b:solver", task_id="b")]
    collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="grpo"))
    assert groups[0].trajectories[0].steps[0].advantage == pytest.approx(0.7 / (1 + 1e-6))  # mean 0, std 1
    collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="rloo"))
    assert groups[0].trajectories[0].steps[0].advantage == pytest.approx(0.7)  # a = r
