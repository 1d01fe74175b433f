"""Numerically hard inputs in float64 match the exact-sum oracle to 1e-6 relative."""

import numpy as np
import pytest
import torch
from reference import BUILTINS, reference_advantages

from rllm_torch import GroupedRewards, compute_advantages, segment_var_mean


def _ragged_groups(center, spread, seed):
    rng = np.random.default_rng(seed)
    return [center + spread * rng.random(n) for n in rng.integers(2, 17, size=64)]


@pytest.mark.parametrize("estimator", BUILTINS)
@pytest.mark.parametrize(
    ("center", "spread"), [(0.3, 1e-5), (1e4, 0.01), (-7e5, 0.5)], ids=["near-constant", "offset-1e4", "offset-7e5"]
)
def test_hard_inputs_match_the_oracle_in_float64(estimator, center, spread):
    groups = _ragged_groups(center, spread, seed=1)
    want = np.concatenate(reference_advantages(estimator, groups))
    for batch in (
        GroupedRewards.from_groups(groups),
        GroupedRewards.from_padded(torch.tensor(np.stack([g[:2] for g in groups]))),
    ):
        got, _ = compute_advantages(batch, estimator)
        expected = (
            want
            if batch.group_size is None
            else np.concatenate(reference_advantages(estimator, [g[:2] for g in groups]))
        )
        scale = np.abs(expected).max()
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6 * scale)


def test_float32_keeps_precision_relative_to_the_spread_not_the_offset():
    # rewards 1e4 + {0, 0.25, 0.5, 0.75} are exact in float32; a naive E[x^2] - E[x]^2 would lose it all
    rewards = torch.tensor([[1e4, 1e4 + 0.25, 1e4 + 0.5, 1e4 + 0.75]], dtype=torch.float32)
    got, _ = compute_advantages(GroupedRewards.from_padded(rewards), "grpo")
    want = np.concatenate(reference_advantages("grpo", [rewards[0].double().numpy()]))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)


def test_segment_var_mean_is_two_pass_with_correction():
    x = torch.tensor([1e8 + 1, 1e8 + 2, 1e8 + 3, 5.0, 5.0], dtype=torch.float64)
    index = torch.tensor([0, 0, 0, 1, 1])
    var, mean = segment_var_mean(x, index, 2, correction=1)
    torch.testing.assert_close(var, torch.tensor([1.0, 0.0], dtype=torch.float64), rtol=0, atol=0)
    torch.testing.assert_close(mean, torch.tensor([1e8 + 2, 5.0], dtype=torch.float64), rtol=0, atol=0)
