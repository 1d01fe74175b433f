"""OPO (Hao et al., arXiv:2505.23585): a hand table, a float64 per-group loop, precision under an
offset, and bad weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllm_torch import (
    GroupedRewards,
    compute_advantages,
    opo,
)
from rllm_torch.core.errors import InvalidRewardsError, InvalidRewardTypeError

settings.register_profile("estimators", max_examples=60, deadline=None)


def opo_reference(groups, weights):
    out = []
    for r, w in zip(groups, weights, strict=True):
        r, w = np.asarray(r, np.float64), np.asarray(w, np.float64)
        if len(r) <= 1:
            out.append(r.copy())
            continue
        baseline = (w * r).sum() / w.sum() if w.sum() > 0 else r.mean()
        out.append(r - baseline)
    return out


@st.composite
def weighted_groups(draw):
    groups = draw(st.lists(st.lists(st.floats(-100, 100), min_size=1, max_size=7), min_size=1, max_size=6))
    weights = [draw(st.lists(st.integers(1, 64), min_size=len(g), max_size=len(g))) for g in groups]
    return groups, weights


def test_opo_hand_table():
    rewards = GroupedRewards.from_groups(
        [[1.0, 0.0], [2.0], [0.5, 0.5, 0.5], [1.0, 0.0]], weights=[[3, 1], [7], [1, 5, 2], [0, 0]]
    )
    adv, ret = opo(rewards)
    # b = (3 * 1 + 1 * 0) / 4; a group of one: baseline 0; constant: 0; weights summing to 0: plain mean
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.75, 2.0, 0.0, 0.0, 0.0, 0.5, -0.5], dtype=torch.float64))
    assert torch.equal(adv, ret) and torch.equal(adv[3:6], torch.zeros(3, dtype=torch.float64))
    empty, _ = opo(GroupedRewards.from_flat(torch.zeros(0), torch.zeros(0, dtype=torch.long), weights=torch.zeros(0)))
    assert empty.shape == (0,)


def test_opo_with_equal_lengths_is_the_plain_group_mean_baseline():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 1.0, 2.0, 2.0]])
    adv, _ = opo(GroupedRewards.from_padded(rewards, weights=torch.full((2, 4), 5.0)))
    dr_grpo, _ = compute_advantages(GroupedRewards.from_padded(rewards), "grpo", norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv, dr_grpo)


@settings(settings.get_profile("estimators"))
@given(data=weighted_groups(), kind=st.sampled_from(["groups", "flat"]))
def test_opo_matches_a_float64_loop(data, kind):
    groups, weights = data
    want = np.concatenate(opo_reference(groups, weights))
    if kind == "groups":
        batch, order = GroupedRewards.from_groups(groups, weights=weights), np.arange(len(want))
    else:  # shuffled flat order
        index = [g for g, group in enumerate(groups) for _ in group]
        order = np.random.default_rng(len(index)).permutation(len(index))
        rewards = torch.tensor([r for group in groups for r in group], dtype=torch.float64)[order]
        lengths = torch.tensor([w for ws in weights for w in ws], dtype=torch.float64)[order]
        batch = GroupedRewards.from_flat(rewards, torch.tensor(index)[order], weights=lengths)
    adv, _ = compute_advantages(batch, "opo")
    np.testing.assert_allclose(adv.numpy(), want[order], rtol=1e-9, atol=1e-9)


def test_opo_float32_keeps_precision_under_a_large_offset_and_constant_groups_are_exactly_zero():
    rewards = torch.tensor([[1e4, 1e4 + 0.01, 1e4 + 0.02], [1e4 + 0.5] * 3], dtype=torch.float32)
    weights = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    adv, _ = opo(GroupedRewards.from_padded(rewards, weights=weights))
    want = opo_reference(rewards.double().tolist(), weights.tolist())
    np.testing.assert_allclose(adv[:3].double().numpy(), want[0], atol=1e-3)  # a float32 ulp at 1e4
    assert torch.equal(adv[3:], torch.zeros(3))


def test_opo_without_weights_says_how_to_give_them():
    with pytest.raises(InvalidRewardsError, match="weights=lengths"):
        opo(GroupedRewards.from_groups([[1.0, 0.0]]))


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: GroupedRewards.from_groups([[1.0, 0.0]], weights=[[1.0]]), "weights"),
        (lambda: GroupedRewards.from_padded(torch.ones(2, 2), weights=torch.ones(2, 3)), "weights"),
        (lambda: GroupedRewards.from_padded(torch.ones(2, 2), weights=-torch.ones(2, 2)), "weights"),
        (
            lambda: GroupedRewards.from_flat(
                torch.ones(2), torch.zeros(2, dtype=torch.long), weights=torch.tensor([1.0, float("nan")])
            ),
            "weights",
        ),
    ],
)
def test_bad_weights_are_typed_errors(build, message):
    with pytest.raises((InvalidRewardsError, InvalidRewardTypeError), match=message):
        build()
