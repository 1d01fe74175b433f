"""verl's ``grpo_passk``: a hand table, a float64 loop and the dense path."""

from __future__ import annotations

import math

import pytest
import torch
from grouped_cases import PEERS, check, flat, grouped
from hypothesis import given
from hypothesis import strategies as st
from reference import reference_advantages

from rllm_torch import GroupedRewards, compute_advantages


def test_grpo_passk_hand_table():
    # [0.2, 0.9, 0.5]: 0.9 - 0.5 = 0.4 on the best; [1, 1, 0]: a tied maximum, all 0; [0.7]: a group
    # of one, baseline 0: 0.7;  [nan, 1]: NaN throughout.  With the std (population):
    # group 0's std is sqrt(((1/3)^2 + (11/30)^2 + (1/30)^2) / 3) = 0.28674
    groups = [[0.2, 0.9, 0.5], [1.0, 1.0, 0.0], [0.7], [math.nan, 1.0]]
    adv, _ = compute_advantages(GroupedRewards.from_groups(groups), "grpo_passk", norm_adv_by_std_in_grpo=False)
    want = [0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.7, math.nan, math.nan]
    torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float64), equal_nan=True)
    scaled, _ = compute_advantages(GroupedRewards.from_groups(groups[:3]), "grpo_passk")
    assert scaled[1].item() == pytest.approx(0.4 / (0.28674 + 1e-6), rel=1e-4)
    assert scaled[6].item() == pytest.approx(0.7 / (1 + 1e-6))  # std 1 for a group of one


@PEERS
@given(groups=grouped(), norm=st.booleans(), correction=st.sampled_from([0, 1]))
def test_grpo_passk_matches_a_float64_loop_and_the_dense_path(groups, norm, correction):
    rewards, index = flat(groups)
    options = dict(norm_adv_by_std_in_grpo=norm, std_correction=correction)
    got, _ = compute_advantages(GroupedRewards.from_flat(rewards, index), "grpo_passk", **options)
    want = reference_advantages("grpo_passk", groups, **options)
    check(got, want)
    width = len(groups[0])
    dense = [(g * width)[:width] for g in groups]  # equal sizes: the [G, K] path
    got_dense, _ = compute_advantages(GroupedRewards.from_padded(torch.tensor(dense)), "grpo_passk", **options)
    check(got_dense.double(), reference_advantages("grpo_passk", dense, **options), rtol=1e-5, atol=1e-5)
