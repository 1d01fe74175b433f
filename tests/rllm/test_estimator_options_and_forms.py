"""Estimator options by name through compute_advantages (an unknown one refused), and the collector's
refusal of token-level estimators with OPO's lengths filled in."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings

from rllm_torch import (
    GroupedRewards,
    compute_advantages,
)
from rllm_torch.core.errors import ConfigError

settings.register_profile("estimators", max_examples=60, deadline=None)


def test_options_pass_through_compute_advantages_by_name_and_unknown_ones_are_refused():
    batch = GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0]])
    adv, _ = compute_advantages(batch, "pass_at_k", k=2, epsilon=1e-6, gamma=1.0)  # run-wide options are filtered
    torch.testing.assert_close(adv, torch.tensor([0.5, -1 / 6, -1 / 6, -1 / 6], dtype=torch.float64))
    with pytest.raises(ConfigError, match="no option 'kk'; it takes: k"):
        compute_advantages(batch, "pass_at_k", kk=2)
    with pytest.raises(ConfigError, match="whiten"):
        compute_advantages(batch, "grpo", whiten=False)


def test_the_collector_refuses_token_level_estimators_and_fills_opo_lengths():
    from rllm_torch import AlgorithmConfig, collect_reward_and_advantage_from_trajectory_groups
    from rllm_torch.rllm.types import Step, Trajectory, TrajectoryGroup

    def traj(reward, tokens, mask=None):
        return Trajectory(steps=[Step(response_ids=list(range(tokens)), response_mask=mask)], reward=reward)

    groups = [TrajectoryGroup([traj(1.0, 3), traj(0.0, 2, [1, 0])], group_id="g0")]  # lengths 3 and 1
    collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="opo"))
    assert [t.steps[0].advantage for t in groups[0].trajectories] == pytest.approx([0.25, -0.75])
    with pytest.raises(ConfigError, match="token-level"):
        collect_reward_and_advantage_from_trajectory_groups(groups, AlgorithmConfig(estimator="gae"))
