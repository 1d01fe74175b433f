"""pass@k (PKPO, Walder and Karkhanis, arXiv:2505.15201): a hand table, a brute-force enumeration of
k-subsets, k = 1, large groups and bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import settings

from rllm_torch import (
    GroupedRewards,
    compute_advantages,
    pass_at_k,
    pass_at_k_rewards,
)
from rllm_torch.core.errors import InvalidRewardsError

settings.register_profile("estimators", max_examples=60, deadline=None)


def pass_at_k_brute_force(group, k):
    """``r~_i``: the mean over every k-subset containing ``i`` of whether the subset passes."""
    n = len(group)
    out = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        passes = [max([group[i], *(group[j] for j in rest)]) for rest in itertools.combinations(others, k - 1)]
        out.append(sum(passes) / len(passes))
    return np.array(out, np.float64)


def test_pass_at_k_hand_table():
    adv, _ = pass_at_k(GroupedRewards.from_groups([[1, 0, 0, 0], [1, 1, 1], [0, 0], [1]]), k=1)
    torch.testing.assert_close(adv, torch.tensor([0.75, -0.25, -0.25, -0.25, 0, 0, 0, 0, 0, 1.0]))
    adv, _ = pass_at_k(GroupedRewards.from_groups([[1, 0, 0, 0], [1, 1, 1], [0, 0]]), k=2)
    # r~ = [1, 1/3, 1/3, 1/3]: a wrong attempt's pair passes when its partner is the right one
    torch.testing.assert_close(adv, torch.tensor([0.5, -1 / 6, -1 / 6, -1 / 6, 0, 0, 0, 0, 0]))
    transformed = pass_at_k_rewards(GroupedRewards.from_groups([[True, False, False, False, False]]), k=5)
    torch.testing.assert_close(transformed, torch.ones(5))  # every 5-subset holds the right one


@pytest.mark.parametrize("n", range(1, 8))
def test_pass_at_k_equals_a_brute_force_enumeration_of_k_subsets(n):
    rng = np.random.default_rng(n)
    groups = [rng.integers(0, 2, size=n).tolist() for _ in range(6)] + [[1] + [0] * (n - 1)]
    batch = GroupedRewards.from_groups([[float(v) for v in g] for g in groups])
    for k in range(1, n + 1):
        got = pass_at_k_rewards(batch, k=k)
        want = np.concatenate([pass_at_k_brute_force(g, k) for g in groups])
        np.testing.assert_allclose(got.double().numpy(), want, rtol=1e-6, atol=1e-7)
        adv, _ = compute_advantages(batch, "pass_at_k", k=k)
        centred = np.concatenate(
            [w - w.mean() if n > 1 else w for w in np.split(want, len(groups))]
        )  # singleton: baseline 0
        np.testing.assert_allclose(adv.double().numpy(), centred, atol=1e-6)


def test_pass_at_k_with_k_1_is_the_plain_group_mean_baseline():
    batch = GroupedRewards.from_groups([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0, 1.0]])
    adv, _ = compute_advantages(batch, "pass_at_k", k=1)
    dr_grpo, _ = compute_advantages(batch, "grpo", norm_adv_by_std_in_grpo=False)
    assert torch.equal(adv, dr_grpo)


def test_pass_at_k_on_large_groups_stays_finite_and_in_range():
    batch = GroupedRewards.from_padded(torch.tensor([[1.0] + [0.0] * 511]), validate=True)
    transformed = pass_at_k_rewards(batch, k=256)
    assert transformed[0] == 1.0 and 0 < transformed[1] < 1 and torch.isfinite(transformed).all()
    np.testing.assert_allclose(transformed[1].item(), 255 / 511, rtol=1e-6)  # C(510,255)/C(511,255) = 256/511


@pytest.mark.parametrize(
    "rewards, k, message",
    [
        ([[1.0, 0.0]], None, "k >= 1"),
        ([[1.0, 0.0]], 0, "k >= 1"),
        ([[1.0, 0.0]], True, "k >= 1"),
        ([[1.0, 0.0]], 2.0, "k >= 1"),
        ([[1.0, 0.0, 1.0], [1.0, 0.0]], 3, "group 1 has 2"),
        ([[1.0, 0.5]], 1, "binary"),
        ([[1.0, float("nan")]], 1, "binary"),
    ],
)
def test_pass_at_k_bad_input_names_the_problem(rewards, k, message):
    with pytest.raises(InvalidRewardsError, match=message):
        compute_advantages(GroupedRewards.from_groups(rewards), "pass_at_k", k=k)
