"""GDPO (arXiv:2601.05242, TRL's ``normalize_then_sum``): a hand table, a float64 loop, float32
components and the padded layout, and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from grouped_cases import PEERS, check, grouped
from hypothesis import given
from hypothesis import strategies as st
from reference import gdpo_reference

from rllm_torch import GroupedRewards, compute_advantages
from rllm_torch.core.errors import ConfigError, InvalidRewardsError


def _gdpo_batch(components, dtype=torch.float64):
    flat = torch.tensor([row for g in components for row in g], dtype=dtype)
    index = torch.repeat_interleave(torch.arange(len(components)), torch.tensor([len(g) for g in components]))
    return GroupedRewards.from_flat(flat[:, 0], index, reward_components=flat)


def test_gdpo_hand_table():
    # group 0: rewards (correct, format) [1, 0], [0, 1]: z_correct = [1, -1], z_format = [-1, 1]
    # (population std 0.5, epsilon 0); group 1: [1, 1], [1, 0]: z_correct = [0, 0], z_format = [1, -1].
    # weights (1, 2): s = [1 - 2, -1 + 2 | 0 + 2, 0 - 2] = [-1, 1, 2, -2]; mean 0, std sqrt(10/4):
    # A = s / 1.5811.  Summing first (GRPO of 1*correct + 2*format: [1, 2 | 3, 1]) would give group 0
    # [-1, 1] and group 1 [1, -1]: the format reward's scale decides.
    batch = _gdpo_batch([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [1.0, 0.0]]])
    adv, _ = compute_advantages(batch, "gdpo", reward_weights=[1.0, 2.0], epsilon=0.0)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0, 2.0, -2.0], dtype=torch.float64) / math.sqrt(2.5))
    constant = _gdpo_batch([[[1.0, 0.0], [1.0, 0.0]], [[0.0, 1.0], [0.0, 1.0]]])
    assert torch.equal(compute_advantages(constant, "gdpo")[0], torch.zeros(4, dtype=torch.float64))


@PEERS
@given(data=grouped(columns=3), weights=st.one_of(st.none(), st.lists(st.floats(-2, 2), min_size=3, max_size=3)))
def test_gdpo_matches_a_float64_loop(data, weights):
    _, components = data
    got, _ = compute_advantages(_gdpo_batch(components), "gdpo", reward_weights=weights)
    want = gdpo_reference(components, weights)
    check(got, want, rtol=1e-7, atol=1e-7)  # whitening a near-constant sum amplifies its rounding


def test_gdpo_float32_components_and_the_padded_layout():
    components = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]])
    padded = GroupedRewards.from_padded(components[..., 0], reward_components=components)
    got, _ = compute_advantages(padded, "gdpo")
    assert got.dtype == torch.float32 and padded.layout.is_dense
    check(got.double(), gdpo_reference([c.numpy() for c in components]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("build", "options", "error", "message"),
    [
        (lambda: GroupedRewards.from_groups([[1.0, 0.0]]), {}, InvalidRewardsError, "no reward components"),
        (
            lambda: _gdpo_batch([[[1.0], [0.0]]]),
            {},
            InvalidRewardsError,
            "one reward function.*it is GRPO followed by a batch whitening: use grpo",
        ),
        (lambda: _gdpo_batch([[[1.0, 0.0], [0.0, 1.0]]]), {"reward_weights": [1.0]}, InvalidRewardsError, "1 value"),
        (
            lambda: _gdpo_batch([[[1.0, 0.0], [0.0, 1.0]]]),
            {"reward_weights": [1.0, math.inf]},
            InvalidRewardsError,
            r"reward_weights\[1\] = inf",
        ),
        (lambda: _gdpo_batch([[[1.0, 0.0], [0.0, 1.0]]]), {"reward_weight": [1, 1]}, ConfigError, "reward_weights"),
    ],
)
def test_gdpo_bad_input_is_a_typed_error(build, options, error, message):
    with pytest.raises(error, match=message):
        compute_advantages(build(), "gdpo", **options)


@pytest.mark.parametrize(
    ("components", "message"),
    [
        (torch.ones(3), r"expected \(3, 'R'\)"),
        (torch.ones(3, 0), r"expected \(3, 'R'\)"),
        (torch.ones(2, 2), r"expected \(3, 'R'\)"),
        ([[1.0, 0.0]] * 3, "must be a torch.Tensor"),
    ],
)
def test_reward_components_of_the_wrong_shape_are_refused(components, message):
    with pytest.raises((InvalidRewardsError, TypeError), match=message):
        GroupedRewards.from_flat(torch.ones(3), torch.tensor([0, 0, 1]), reward_components=components)
