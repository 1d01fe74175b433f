"""verl's ``grpo_passk``: a hand table, a float64 loop and the dense path."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import reference_advantages

from rllm_torch import GroupedRewards, compute_advantages

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


@settings(settings.get_profile("peers"))
@given(groups=grouped(), norm=st.booleans(), correction=st.sampled_from([0, 1]))
def test_grpo_passk_matches_a_float64_loop_and_the_dense_path(groups, norm, correction):
    rewards, index = _flat(groups)
    options = dict(norm_adv_by_std_in_grpo=norm, std_correction=correction)
    got, _ = compute_advantages(GroupedRewards.from_flat(rewards, index), "grpo_passk", **options)
    want = reference_advantages("grpo_passk", groups, **options)
    _check(got, want)
    width = len(groups[0])
    dense = [(g * width)[:width] for g in groups]  # equal sizes: the [G, K] path
    got_dense, _ = compute_advantages(GroupedRewards.from_padded(torch.tensor(dense)), "grpo_passk", **options)
    _check(got_dense.double(), reference_advantages("grpo_passk", dense, **options), rtol=1e-5, atol=1e-5)
