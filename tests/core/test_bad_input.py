"""Bad input fails before any computation with a typed error that says what and where."""

import numpy as np
import pytest
import torch

from rllm_torch import (
    AlgorithmConfig,
    GroupedRewards,
    InvalidGroupIndexError,
    InvalidRewardsError,
    InvalidRewardTypeError,
    UnknownEstimatorError,
    calculate_grpo_advantages,
    compute_advantages,
    factorize_group_labels,
    get_rllm_adv_estimator,
    grpo,
)


def test_mismatched_lengths_of_rewards_and_group_ids():
    with pytest.raises(InvalidGroupIndexError, match="group_index has 2 entries but rewards has 3"):
        GroupedRewards.from_flat(torch.zeros(3), torch.tensor([0, 1]))


def test_group_id_out_of_range_names_its_position():
    with pytest.raises(InvalidGroupIndexError, match=r"group_index\[2\] = 5 is outside \[0, 3\)"):
        GroupedRewards.from_flat(torch.zeros(4), torch.tensor([0, 1, 5, 2]), num_groups=3)
    with pytest.raises(InvalidGroupIndexError, match=r"group_index\[1\] = -1"):
        GroupedRewards.from_flat(torch.zeros(2), torch.tensor([0, -1]))


def test_float_group_index_is_rejected():
    with pytest.raises(InvalidGroupIndexError, match="integer dtype"):
        GroupedRewards.from_flat(torch.zeros(2), torch.tensor([0.0, 1.0]))


def test_mask_of_the_wrong_shape():
    with pytest.raises(InvalidGroupIndexError, match=r"mask has shape \(2, 3\) but rewards has shape \(2, 4\)"):
        GroupedRewards.from_padded(torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool))


def test_tensors_on_different_devices():
    with pytest.raises(InvalidGroupIndexError, match="group_index is on meta but rewards is on cpu"):
        GroupedRewards.from_flat(torch.zeros(2), torch.zeros(2, dtype=torch.long, device="meta"))
    with pytest.raises(InvalidGroupIndexError, match="mask is on meta"):
        GroupedRewards.from_padded(torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool, device="meta"))


def test_none_reward_names_group_and_position():
    with pytest.raises(InvalidRewardsError, match="group 1, position 2 is None"):
        GroupedRewards.from_groups([[1.0], [0.0, 1.0, None]])
    with pytest.raises(InvalidRewardsError, match="group 0, position 0 is None"):
        calculate_grpo_advantages([np.array([None, 1.0])])


def test_non_numeric_reward_names_group_and_position():
    with pytest.raises(InvalidRewardTypeError, match="group 0, position 1 is 'yes'"):
        GroupedRewards.from_groups([[1.0, "yes"]])
    with pytest.raises(InvalidRewardTypeError, match="group 0, position 0"):
        GroupedRewards.from_groups([["a", "b"]])
    with pytest.raises(InvalidRewardTypeError, match="dtype torch.complex64"):
        GroupedRewards.from_flat(torch.zeros(2, dtype=torch.complex64), torch.tensor([0, 0]))
    with pytest.raises(InvalidRewardTypeError, match="group 0 must be a sequence"):
        GroupedRewards.from_groups([1.0, 2.0])


def test_a_group_that_is_not_one_dimensional():
    with pytest.raises(InvalidRewardsError, match=r"group 0 must be 1-D .* shape \(2, 2\)"):
        GroupedRewards.from_groups([np.zeros((2, 2))])


def test_unknown_estimator_lists_the_registered_names():
    with pytest.raises(UnknownEstimatorError, match="unknown advantage estimator 'gpro'; registered: .*grpo.*rloo"):
        get_rllm_adv_estimator("gpro")
    with pytest.raises(UnknownEstimatorError, match="gpro"):
        compute_advantages(GroupedRewards.from_groups([[1.0]]), "gpro")


def test_estimators_reject_anything_but_packed_rewards():
    with pytest.raises(InvalidRewardTypeError, match="grpo expects a GroupedRewards, got Tensor"):
        grpo(torch.zeros(4))
    with pytest.raises(InvalidRewardsError, match="epsilon must be a non-negative"):
        grpo(GroupedRewards.from_groups([[1.0, 0.0]]), epsilon=-1.0)
    with pytest.raises(InvalidRewardTypeError, match="norm_adv_by_std_in_grpo must be a bool"):
        grpo(GroupedRewards.from_groups([[1.0, 0.0]]), norm_adv_by_std_in_grpo="yes")


def test_labels_that_are_none_or_unhashable():
    with pytest.raises(InvalidGroupIndexError, match="position 1 is None"):
        factorize_group_labels(["a", None])
    with pytest.raises(InvalidGroupIndexError, match="position 0 .* not hashable"):
        factorize_group_labels([["a"], ["b"]])
    with pytest.raises(InvalidGroupIndexError, match="labels has 1 entries but rewards has 2"):
        GroupedRewards.from_labels(torch.zeros(2), ["a"])


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("stepwise_advantage_mode", "per_token", r"rllm\.stepwise_advantage\.mode='per_token' is not one of"),
        ("loss_fn", "ppo2", r"rllm\.algorithm\.loss_fn: 'ppo2' is not one of"),
        ("lr_schedule", "exp", r"rllm\.algorithm\.lr_schedule='exp' is not one of"),
        ("warmup_steps_ratio", 1.5, r"rllm\.algorithm\.warmup_steps_ratio=1.5 is out of range; it must be in \[0, 1\]"),
        ("epsilon", -1e-6, "epsilon must be a non-negative"),
        ("std_correction", 0.5, "std_correction must be a non-negative int"),
        ("norm_adv_by_std_in_grpo", "true", "norm_adv_by_std_in_grpo must be a bool"),
        ("estimator", "", "estimator must be a non-empty"),
    ],
)
def test_algorithm_config_rejects_invalid_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        AlgorithmConfig(**{field: value})


def test_a_bare_register_decorator_is_reported():
    from rllm_torch import register_rllm_adv_estimator
    from rllm_torch.core.errors import EstimatorRegistrationError

    with pytest.raises(EstimatorRegistrationError, match=r"write @register_rllm_adv_estimator\('my_name'\)"):

        @register_rllm_adv_estimator
        def my_estimator(rewards, **kwargs):
            return rewards, rewards

    with pytest.raises(ValueError, match="form must be 'arrays'"):
        register_rllm_adv_estimator("x", form="bogus")
    with pytest.raises(UnknownEstimatorError, match="non-empty str"):
        register_rllm_adv_estimator("")


def test_options_are_checked_for_every_estimator():
    batch = GroupedRewards.from_groups([[1.0, 0.0]])
    with pytest.raises(InvalidRewardsError, match="std_correction must be a non-negative int"):
        compute_advantages(batch, "rloo", std_correction=-1)
    with pytest.raises(InvalidRewardsError, match="epsilon must be a non-negative"):
        compute_advantages(batch, "reinforce", epsilon="a")


def test_sparse_group_ids_without_num_groups_point_to_factorize():
    with pytest.raises(
        InvalidGroupIndexError, match="goes up to 1000000000000 for only 2 rewards.*factorize_group_labels"
    ):
        GroupedRewards.from_flat(torch.zeros(2), torch.tensor([0, 10**12]))


def test_labels_must_be_a_sequence_not_a_string():
    with pytest.raises(InvalidGroupIndexError, match="labels must be a sequence"):
        GroupedRewards.from_labels(torch.zeros(2), "ab")
    with pytest.raises(InvalidGroupIndexError, match="labels must be a sequence"):
        GroupedRewards.from_labels(torch.zeros(2), 3)
