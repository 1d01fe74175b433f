"""GRPO with TRL's ``scale_rewards="batch"``: a hand table, a float64 loop, and what it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_advantages

from rllm_torch import GroupedRewards, compute_advantages
from rllm_torch.core.errors import InvalidRewardsError

settings.register_profile("peers", max_examples=40, deadline=None)


@st.composite
def grouped(draw, max_groups: int = 6, columns: int = 0):
    """Ragged groups of rewards (quarters, so ties happen) and, with ``columns``, ``[n_g, R]``."""
    value = st.integers(-8, 8).map(lambda v: v / 4)
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=max_groups))
    groups = [[draw(value) for _ in range(n)] for n in sizes]
    if not columns:
        return groups
    return groups, [[[draw(value) for _ in range(columns)] for _ in range(n)] for n in sizes]


def _flat(groups):
    rewards = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
    index = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
    return rewards, index


def _check(got: torch.Tensor, want: list[np.ndarray], **tol):
    np.testing.assert_allclose(got.numpy(), np.concatenate(want), **(tol or dict(rtol=1e-9, atol=1e-9)))


def test_grpo_with_the_batch_std_hand_table():
    # rewards [1, 0 | 1, 1 | 0.5]: group means 0.5, 1, (a group of one: 0); the batch's population
    # std of [1, 0, 1, 1, 0.5]: mean 0.7, var (0.09 + 0.49 + 0.09 + 0.09 + 0.04) / 5 = 0.16, std 0.4
    batch = GroupedRewards.from_groups([[1.0, 0.0], [1.0, 1.0], [0.5]])
    adv, _ = compute_advantages(batch, "grpo", scale_rewards="batch", epsilon=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.25, -1.25, 0.0, 0.0, 1.25], dtype=torch.float64))
    assert torch.equal(adv[2:4], torch.zeros(2, dtype=torch.float64))  # a constant group: exactly 0
    per_group, _ = compute_advantages(batch, "grpo", epsilon=0.0)
    assert per_group[0].item() == pytest.approx(1.0)  # group scale: (1 - 0.5) / 0.5


@settings(settings.get_profile("peers"))
@given(groups=grouped(), correction=st.sampled_from([0, 1]))
def test_grpo_with_the_batch_std_matches_a_float64_loop(groups, correction):
    if sum(map(len, groups)) <= correction:
        return
    rewards, index = _flat(groups)
    got, _ = compute_advantages(
        GroupedRewards.from_flat(rewards, index), "grpo", scale_rewards="batch", std_correction=correction
    )
    _check(got, reference_advantages("grpo", groups, scale_rewards="batch", std_correction=correction))


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
