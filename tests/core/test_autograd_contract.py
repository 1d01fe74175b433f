"""The autograd contract: every estimator, built-in or registered, returns detached advantages
(constants of the policy-gradient loss), whatever the rewards carry, and never raises on rewards
that require a gradient."""

from __future__ import annotations

import pytest
import torch
from reference import BUILTINS

import rllm_torch
from rllm_torch import GroupedRewards, compute_advantages, register_rllm_adv_estimator


@register_rllm_adv_estimator("test_autograd_tensor_form", form="tensors")
def _differentiable(batch):
    adv = batch.rewards * 2.0  # carries the rewards' graph
    return adv, adv


@register_rllm_adv_estimator("test_autograd_arrays_form")
def _arrays(rewards, **kwargs):
    return [r - r.mean() for r in rewards], [r - r.mean() for r in rewards]


def _batches(rewards):
    return [
        GroupedRewards.from_padded(rewards.view(2, 3)),
        GroupedRewards.from_flat(rewards, torch.tensor([0, 1, 0, 1, 1, 2]), num_groups=3),
    ]


@pytest.mark.parametrize("estimator", [*BUILTINS, "test_autograd_tensor_form", "test_autograd_arrays_form"])
def test_advantages_are_detached_from_rewards_that_require_grad(estimator):
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.9, 0.4], requires_grad=True)
    for batch in _batches(rewards):
        adv, ret = compute_advantages(batch, estimator)
        assert not adv.requires_grad and not ret.requires_grad and adv.grad_fn is None
        # a loss built on them backpropagates to the policy only: here, through nothing
        logp = torch.zeros(6, requires_grad=True)
        (-(adv * logp).sum()).backward()
        assert torch.equal(logp.grad, -adv) and rewards.grad is None


@pytest.mark.parametrize("estimator", BUILTINS)
def test_built_ins_called_directly_are_detached_too(estimator):
    rewards = torch.tensor([[1.0, 0.0, 0.5], [0.2, 0.9, 0.4]], requires_grad=True)
    adv, _ = getattr(rllm_torch, estimator)(GroupedRewards.from_padded(rewards))
    assert adv.grad_fn is None and not adv.requires_grad


def test_the_tensor_form_keeps_one_object_for_both_outputs():
    rewards = torch.tensor([1.0, 0.0], requires_grad=True)
    adv, ret = compute_advantages(GroupedRewards.from_padded(rewards.view(1, 2)), "test_autograd_tensor_form")
    assert adv is ret
