"""GRPO with TRL's ``scale_rewards="batch"``: a hand table, a float64 loop, and what it refuses."""

from __future__ import annotations

import math

import pytest
import torch
from grouped_cases import PEERS, check, flat, grouped
from hypothesis import given
from hypothesis import strategies as st
from reference import reference_advantages

from rllm_torch import GroupedRewards, compute_advantages
from rllm_torch.core.errors import InvalidRewardsError


def test_grpo_with_the_batch_std_hand_table():
    # rewards [1, 0 | 1, 1 | 0.5]: group means 0.5, 1, (a group of one: 0); the batch's population
    # std of [1, 0, 1, 1, 0.5]: mean 0.7, var (0.09 + 0.49 + 0.09 + 0.09 + 0.04) / 5 = 0.16, std 0.4
    batch = GroupedRewards.from_groups([[1.0, 0.0], [1.0, 1.0], [0.5]])
    adv, _ = compute_advantages(batch, "grpo", scale_rewards="batch", epsilon=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.25, -1.25, 0.0, 0.0, 1.25], dtype=torch.float64))
    assert torch.equal(adv[2:4], torch.zeros(2, dtype=torch.float64))  # a constant group: exactly 0
    per_group, _ = compute_advantages(batch, "grpo", epsilon=0.0)
    assert per_group[0].item() == pytest.approx(1.0)  # group scale: (1 - 0.5) / 0.5


@PEERS
@given(groups=grouped(), correction=st.sampled_from([0, 1]))
def test_grpo_with_the_batch_std_matches_a_float64_loop(groups, correction):
    if sum(map(len, groups)) <= correction:
        return
    rewards, index = flat(groups)
    got, _ = compute_advantages(
        GroupedRewards.from_flat(rewards, index), "grpo", scale_rewards="batch", std_correction=correction
    )
    check(got, reference_advantages("grpo", groups, scale_rewards="batch", std_correction=correction))


def test_grpo_scale_rewards_refuses_what_it_cannot_do():
    batch = GroupedRewards.from_groups([[1.0, 0.0]])
    with pytest.raises(InvalidRewardsError, match="TRL's 'none' is norm_adv_by_std_in_grpo=False"):
        compute_advantages(batch, "grpo", scale_rewards="none")
    with pytest.raises(InvalidRewardsError, match="set only one"):
        compute_advantages(batch, "grpo", scale_rewards="batch", norm_adv_by_std_in_grpo=False)
    nan, _ = compute_advantages(
        GroupedRewards.from_groups([[1.0, math.nan], [0.0, 1.0]]), "grpo", scale_rewards="batch"
    )
    assert torch.isnan(nan).all()  # the batch std is batch-wide
