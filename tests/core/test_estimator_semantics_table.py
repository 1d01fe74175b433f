"""Hand-worked tables: the arithmetic is in the comments."""

import math

import pytest
import torch

from rllm_torch import GroupedRewards, grpo, prpo, reinforce, reinforce_plus_plus_baseline, rloo

EPS = 1e-6


def packed(*groups, dtype=torch.float64):
    return GroupedRewards.from_groups([torch.tensor(g, dtype=dtype) for g in groups])


def test_grpo_of_negative_rewards_standardises_within_the_group():
    # [-3, -1]: mean -2, population std 1 -> (-1, +1) / (1 + eps)
    adv, _ = grpo(packed([-3.0, -1.0]))
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0], dtype=torch.float64) / (1 + EPS))


def test_grpo_with_sample_std_uses_bessel_correction():
    # [0, 2, 4]: mean 2, sample std sqrt((4+0+4)/2) = 2 -> (-1, 0, 1) * 2 / (2 + eps)
    adv, _ = grpo(packed([0.0, 2.0, 4.0]), std_correction=1)
    torch.testing.assert_close(adv, torch.tensor([-2.0, 0.0, 2.0], dtype=torch.float64) / (2 + EPS))


def test_grpo_epsilon_is_added_outside_the_square_root():
    # [0, 1]: std 0.5; with epsilon 0.5 the denominator is 1.0 -> (-0.5, 0.5)
    adv, _ = grpo(packed([0.0, 1.0]), epsilon=0.5)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5], dtype=torch.float64))


def test_dr_grpo_only_subtracts_the_group_mean():
    adv, _ = grpo(packed([1.0, 2.0, 6.0], [5.0]), norm_adv_by_std_in_grpo=False)
    # group 0 mean 3 -> (-2, -1, 3); a group of one has mean 0 -> 5
    torch.testing.assert_close(adv, torch.tensor([-2.0, -1.0, 3.0, 5.0], dtype=torch.float64))


def test_rloo_subtracts_the_mean_of_the_other_rewards():
    # [1, 2, 6]: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5
    adv, _ = rloo(packed([1.0, 2.0, 6.0]))
    torch.testing.assert_close(adv, torch.tensor([-3.0, -1.5, 4.5], dtype=torch.float64))


def test_reinforce_returns_a_new_float_tensor():
    rewards = torch.tensor([1.0, 0.0, 0.5])
    adv, ret = reinforce(GroupedRewards.from_flat(rewards, torch.tensor([0, 0, 1])))
    assert adv is ret and adv is not rewards and adv.data_ptr() != rewards.data_ptr()
    torch.testing.assert_close(adv, rewards)


def test_reinforce_plus_plus_baseline_whitens_over_the_batch():
    # c = [0.5, -0.5] (group [1, 0]) and [2] (a group of one keeps baseline 0)
    # mean(c) = 2/3; var = ((1/6)^2 + (7/6)^2 + (4/3)^2) / 3 = (1 + 49 + 64) / 108 = 114/108
    adv, _ = reinforce_plus_plus_baseline(packed([1.0, 0.0], [2.0]))
    std = math.sqrt(114 / 108)
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 2.0], dtype=torch.float64) / (std + EPS))


def test_prpo_ignores_groups():
    # all rewards [0, 2, 4]: mean 2, population std sqrt(8/3)
    adv, _ = prpo(packed([0.0, 2.0], [4.0]))
    torch.testing.assert_close(adv, torch.tensor([-2.0, 0.0, 2.0], dtype=torch.float64) / (math.sqrt(8 / 3) + EPS))


@pytest.mark.parametrize("estimator", [grpo, rloo, reinforce_plus_plus_baseline])
@pytest.mark.parametrize("value", [0.1, 0.7, -3.3, 1e4 + 0.1])
def test_constant_groups_give_exactly_zero(estimator, value):
    # 0.1 * 3 / 3 != 0.1 in floating point; the shifted two-pass mean makes it exact anyway
    batch = packed([value] * 3, [value] * 5, [0.0, 1.0])
    adv, _ = estimator(batch)
    assert torch.equal(adv[:8], torch.zeros(8, dtype=torch.float64))


def test_prpo_of_a_constant_batch_is_exactly_zero():
    adv, _ = prpo(packed([0.1, 0.1], [0.1]))
    assert torch.equal(adv, torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("estimator", [grpo, rloo, reinforce, reinforce_plus_plus_baseline, prpo])
def test_an_empty_batch_gives_empty_outputs(estimator):
    adv, ret = estimator(GroupedRewards.from_groups([]))
    assert adv.shape == ret.shape == (0,)
    adv, _ = estimator(GroupedRewards.from_flat(torch.zeros(0), torch.zeros(0, dtype=torch.long), num_groups=0))
    assert adv.shape == (0,) and adv.dtype == torch.float32


@pytest.mark.parametrize("estimator", [grpo, rloo, reinforce])
def test_nan_stays_inside_its_own_group(estimator):
    adv, _ = estimator(packed([1.0, float("nan"), 0.0], [1.0, 0.0], [2.0]))
    assert adv[:3].isnan().any()
    assert not adv[3:].isnan().any()


@pytest.mark.parametrize("estimator", [reinforce_plus_plus_baseline, prpo])
def test_nan_in_batch_wide_estimators_stays_inside_the_call(estimator):
    # batch-wide whitening: NaN reaches the batch (one role), never another call
    adv, _ = estimator(packed([1.0, float("nan")], [1.0, 0.0]))
    assert adv.isnan().all()
    adv, _ = estimator(packed([1.0, 0.0]))
    assert not adv.isnan().any()


@pytest.mark.parametrize("bad", [float("inf"), -float("inf")])
@pytest.mark.parametrize("estimator", [grpo, rloo, reinforce, reinforce_plus_plus_baseline, prpo])
def test_an_infinite_reward_is_confined_like_nan_to_its_group_or_batch_wide_to_its_call(estimator, bad):
    # the documented rule (docs/estimators.md): a NaN or infinite reward makes its group's advantages non-finite (its
    # batch's, for the batch-wide estimators); the tensor path does not check (a check would sync)
    adv, _ = estimator(packed([1.0, bad, 0.0], [1.0, 0.0], [2.0]))
    assert not adv[:3].isfinite().all()
    batch_wide = estimator in (reinforce_plus_plus_baseline, prpo)
    assert adv[3:].isfinite().any() != batch_wide and adv[3:].isfinite().all() != batch_wide


def test_bfloat16_rewards_give_float32_advantages():
    # 0.1 rounds to 0.10009765625 in bf16; [bf(0.1), 0]: mean m = 0.050048828125, std = m
    batch = GroupedRewards.from_groups([torch.tensor([0.1, 0.0], dtype=torch.bfloat16)])
    adv, _ = grpo(batch)
    m = 0.050048828125
    assert adv.dtype == torch.float32
    torch.testing.assert_close(adv, torch.tensor([m / (m + EPS), -m / (m + EPS)]))


@pytest.mark.parametrize("dtype", [torch.bool, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32])
def test_non_float64_rewards_give_float32(dtype):
    adv, _ = grpo(GroupedRewards.from_padded(torch.tensor([[1, 0, 1, 1]], dtype=dtype)))
    assert adv.dtype == torch.float32
    torch.testing.assert_close(
        adv, torch.tensor([1.0, -3.0, 1.0, 1.0]) / (math.sqrt(3) + 4 * EPS), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_a_trailing_empty_group_is_allowed_on_every_constructor(estimator):
    from rllm_torch import compute_advantages

    want, _ = compute_advantages(packed([1.0, 0.0]), estimator)
    for batch in (
        GroupedRewards.from_groups([[1.0, 0.0], []]),
        GroupedRewards.from_flat(torch.tensor([1.0, 0.0], dtype=torch.float64), torch.tensor([0, 0]), num_groups=3),
        GroupedRewards.from_padded(
            torch.tensor([[1.0, 0.0], [9.0, 9.0]], dtype=torch.float64), torch.tensor([[True, True], [False, False]])
        ),
    ):
        torch.testing.assert_close(compute_advantages(batch, estimator)[0], want)


def test_zero_groups_in_a_padded_tensor_give_an_empty_flat_result():
    adv, _ = grpo(GroupedRewards.from_padded(torch.ones(0, 4)))
    assert adv.shape == (0,)


@pytest.mark.parametrize(
    ("estimator", "groups"),
    [
        (grpo, ([0.3, 0.3], [0.7] * 3)),
        (reinforce_plus_plus_baseline, ([0.3, 0.3], [0.7] * 3)),
        (prpo, ([0.3, 0.3], [0.3])),
    ],
)
def test_constant_groups_stay_exactly_zero_with_epsilon_zero(estimator, groups):
    # std = 0 and epsilon = 0 would give 0/0; the centred values are exactly 0, so the advantage is too
    adv, _ = estimator(packed(*groups), epsilon=0.0)
    assert torch.equal(adv, torch.zeros_like(adv))
