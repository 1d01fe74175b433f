"""float32 estimators are as accurate as a float32 per-group loop on large groups with large
rewards: the class of verl's ``test_rloo_and_vectorized_equivalence`` (512 rows of 512 tokens in
10 groups, sequence scores summed over about 256 random-normal token rewards), at its tolerance
(rtol 1e-5, atol 1e-6), against a float64 reference of the same float32 scores."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from reference import reference_advantages

import rllm_torch
from rllm_torch import GroupedRewards, compute_advantages


def _scores(batch: int, seq: int, num_groups: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 sequence scores (token rewards summed under a random mask) and a shuffled group
    index with at least 2 members per group."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.full((num_groups,), 2) + torch.bincount(
        torch.randint(0, num_groups, (batch - 2 * num_groups,), generator=g), minlength=num_groups
    )
    index = torch.repeat_interleave(torch.arange(num_groups), counts)[torch.randperm(batch, generator=g)]
    mask = torch.randint(0, 2, (batch, seq), generator=g).float()
    rewards = torch.randn(batch, seq, generator=g) * mask
    return rewards.sum(-1), index


@pytest.mark.parametrize(
    "case", [(64, 128, 5, 0), (128, 256, 8, 1), (512, 512, 10, 2), (512, 512, 10, 3), (2048, 512, 4, 4)]
)
@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_large_float32_groups_are_as_accurate_as_a_float32_loop(case, estimator):
    scores, index = _scores(*case)
    got, _ = compute_advantages(GroupedRewards.from_flat(scores, index, num_groups=case[2]), estimator)
    groups = [scores[index == g].double().numpy() for g in range(case[2])]
    want_by_group = reference_advantages(estimator, groups)
    want = np.empty(len(scores))
    for g, values in enumerate(want_by_group):
        want[(index == g).numpy()] = values
    np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-5, atol=1e-6)


def test_the_largest_verl_case_has_members_far_from_their_mean():
    """The input is the hard kind: the first member of a group (the shift) is far from its mean."""
    scores, index = _scores(512, 512, 10, 2)
    spread = max(float((scores[index == g] - scores[index == g].mean()).abs().max()) for g in range(10))
    assert spread > 30


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("layout", ["dense", "interleaved", "group-major ragged"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_constant_groups_of_values_float_cannot_sum_exactly_are_exactly_zero(estimator, layout, dtype):
    """A running float32 sum of 0.1 seven times is not 7 * 0.1: the group mean must not come from
    a plain float32 sum (float32 values are summed in float64, exact here; float64 values are
    shifted by their group's first member). Each constant group sits next to groups that differ,
    so a shift taken from the wrong group (an off-by-one in the group starts) shows."""
    values = [0.1, 1 / 3, 1e4 + 0.1, -7e5 + 0.3]
    size = 7
    rewards = torch.tensor([[v] * size for v in values], dtype=dtype)
    if layout == "dense":
        batch = GroupedRewards.from_padded(rewards)
        constant = slice(None)
    elif layout == "interleaved":  # the same groups interleaved, with a singleton group
        flat = torch.cat([rewards.T.reshape(-1), torch.tensor([0.5], dtype=dtype)])
        index = torch.cat([torch.arange(4).repeat(size), torch.tensor([4])])
        batch = GroupedRewards.from_flat(flat, index, num_groups=5)
        constant = slice(0, 4 * size)
    else:  # from_groups: group-major, ragged, a non-constant group between constant ones
        groups = [rewards[0], torch.tensor([1.0, 2.0], dtype=dtype), *rewards[1:]]
        batch = GroupedRewards.from_groups(groups)
        assert batch.group_major and not batch.layout.is_dense
        constant = torch.cat([torch.arange(size), torch.arange(size + 2, 4 * size + 2)])
    adv, _ = compute_advantages(batch, estimator)
    assert torch.equal(adv[constant], torch.zeros_like(adv[constant])), adv


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_compiled_estimators_keep_the_accuracy_and_the_exact_zeros(estimator):
    """Inside torch.compile on CPU the float32 group mean is a corrected two-pass float32 mean
    (inductor's float64 reductions are slow there): the verl-class inputs still pass at its
    tolerance, and constant groups of values float32 cannot sum exactly are still exactly 0."""
    fn = getattr(rllm_torch, estimator)
    ragged = torch.compile(
        lambda r, i: fn(GroupedRewards.from_flat(r, i, num_groups=10, validate=False))[0], fullgraph=True
    )
    scores, index = _scores(512, 512, 10, 2)
    groups = [scores[index == g].double().numpy() for g in range(10)]
    want = np.empty(len(scores))
    for g, values in enumerate(reference_advantages(estimator, groups)):
        want[(index == g).numpy()] = values
    np.testing.assert_allclose(ragged(scores, index).double().numpy(), want, rtol=1e-5, atol=1e-6)
    dense = torch.compile(lambda r: fn(GroupedRewards.from_padded(r, validate=False))[0], fullgraph=True)
    constant = torch.tensor([[v] * 7 for v in (0.1, 1 / 3, 1e4 + 0.1, -7e5 + 0.3)])
    assert torch.equal(dense(constant), torch.zeros(28))
    mixed = torch.cat([constant, torch.tensor([[1.0, 2, 3, 4, 5, 6, 7]])])
    torch.testing.assert_close(dense(mixed), fn(GroupedRewards.from_padded(mixed))[0], rtol=1e-5, atol=1e-6)
