"""Contracts: inputs are not mutated, outputs stay on the input's device, torch.compile traces."""

import pytest
import torch
from reference import BUILTINS

from rllm_torch import GroupedRewards, compute_advantages, grpo, reinforce_plus_plus_baseline, rloo


@pytest.mark.parametrize("estimator", BUILTINS)
@pytest.mark.parametrize("dense", [True, False])
def test_inputs_are_not_mutated_and_outputs_are_new_tensors(estimator, dense):
    rewards = torch.tensor([[1.0, 0.0, 0.5], [0.2, 0.2, 0.9]], dtype=torch.float64)
    batch = (
        GroupedRewards.from_padded(rewards)
        if dense
        else GroupedRewards.from_flat(rewards.reshape(-1).clone(), torch.tensor([0, 0, 0, 1, 1, 1]))
    )
    before = batch.rewards.clone()
    adv, ret = compute_advantages(batch, estimator)
    assert torch.equal(batch.rewards, before)
    assert adv.data_ptr() != batch.rewards.data_ptr()
    assert adv.shape == (6,) and adv.device == rewards.device


@pytest.mark.parametrize("estimator", [grpo, rloo, reinforce_plus_plus_baseline])
def test_estimators_run_on_the_meta_device_without_reading_data(estimator):
    # meta tensors have no data: any .item()/.tolist()/nonzero (a host sync on CUDA) would fail here
    dense = GroupedRewards.from_padded(torch.zeros(4, 8, device="meta"))
    ragged = GroupedRewards.from_flat(
        torch.zeros(10, device="meta"), torch.zeros(10, dtype=torch.long, device="meta"), num_groups=3, validate=False
    )
    for batch in (dense, ragged):
        adv, _ = estimator(batch)
        assert adv.device.type == "meta" and adv.shape == (batch.num_trajectories,)


def _grpo_dense(rewards_GK):
    return grpo(GroupedRewards.from_padded(rewards_GK))[0]


def _rloo_ragged(rewards_N, group_index_N):
    return rloo(GroupedRewards.from_flat(rewards_N, group_index_N, num_groups=3, validate=False))[0]


def test_estimators_compile_with_fullgraph():
    torch._dynamo.reset()
    rewards = torch.rand(4, 5)
    torch.testing.assert_close(torch.compile(_grpo_dense, fullgraph=True)(rewards), _grpo_dense(rewards))
    flat, index = torch.rand(7), torch.tensor([0, 1, 0, 2, 1, 2, 2])
    torch.testing.assert_close(torch.compile(_rloo_ragged, fullgraph=True)(flat, index), _rloo_ragged(flat, index))


def test_reduced_precision_matmul_settings_do_not_change_the_advantages():
    rewards = torch.rand(64, 8, generator=torch.Generator().manual_seed(0)) + 1000.0
    exact, _ = grpo(GroupedRewards.from_padded(rewards))
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")  # would allow bf16 matmuls
        relaxed, _ = grpo(GroupedRewards.from_padded(rewards))
    finally:
        torch.set_float32_matmul_precision(previous)
    torch.testing.assert_close(relaxed, exact, rtol=1e-5, atol=1e-5)
