"""Every registered estimator is reachable both ways: ``get_rllm_adv_estimator`` (per-group arrays
in, per-group lists out, as rLLM calls it) and ``get_tensor_adv_estimator`` (packed rewards in,
``[N]`` tensors out); both give what ``compute_advantages`` gives. The rLLM list API packs on the
numpy side and keeps its dtypes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllm_torch import (
    ConfigError,
    GroupedRewards,
    InvalidRewardsError,
    calculate_grpo_advantages,
    compute_advantages,
    get_rllm_adv_estimator,
    get_tensor_adv_estimator,
    register_rllm_adv_estimator,
    registered_estimator_names,
)


@register_rllm_adv_estimator("test_both_ways_tensor", form="tensors")
def _tensor_form(batch, *, epsilon=1e-6):
    layout = batch.layout
    adv = layout.flat(layout.center(layout.values(batch.rewards.double())).values) / (1.0 + epsilon)
    return adv, adv


@register_rllm_adv_estimator("test_both_ways_arrays")
def _arrays_form(rewards, **kwargs):
    adv = [r - r.max() for r in rewards]
    return adv, adv


GROUPS = [np.array([1.0, 0.0, 0.5]), np.array([0.2]), np.array([0.9, 0.1])]


# opo needs lengths, gdpo several rewards per trajectory, pass_at_k its k and binary rewards and
# remax each group's greedy reward (tested below); the token-level ones have no per-group form
NEED_MORE = {"opo", "gdpo", "pass_at_k", "remax", "reinforce_plus_plus", "gae", "optimal_token_baseline"}


@pytest.mark.parametrize("name", [n for n in registered_estimator_names() if n not in NEED_MORE])
def test_every_registered_estimator_is_callable_the_rllm_way_and_on_tensors(name):
    batch = GroupedRewards.from_groups(GROUPS)
    want, _ = compute_advantages(batch, name)
    adv_by_group, ret_by_group = get_rllm_adv_estimator(name)(GROUPS)  # rLLM's call: a list of arrays
    assert len(adv_by_group) == len(ret_by_group) == len(GROUPS)
    assert all(isinstance(a, np.ndarray) and a.shape == g.shape for a, g in zip(adv_by_group, GROUPS, strict=True))
    np.testing.assert_allclose(np.concatenate(adv_by_group), want.numpy(), rtol=1e-12, atol=1e-12)
    got, _ = get_tensor_adv_estimator(name)(batch)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_pass_at_k_takes_its_option_the_rllm_way_and_the_others_say_what_they_need():
    groups = [np.array([1.0, 0.0, 0.0]), np.array([1.0, 1.0]), np.array([0.0, 1.0, 1.0, 0.0])]
    adv_by_group, _ = get_rllm_adv_estimator("pass_at_k")(groups, k=2)
    want, _ = compute_advantages(GroupedRewards.from_groups(groups), "pass_at_k", k=2)
    np.testing.assert_allclose(np.concatenate(adv_by_group), want.numpy(), rtol=1e-12)
    with pytest.raises(InvalidRewardsError, match="weights=lengths"):  # rLLM's arrays carry no lengths
        get_rllm_adv_estimator("opo")(groups)
    with pytest.raises(InvalidRewardsError, match="no reward components"):  # nor several rewards
        get_rllm_adv_estimator("gdpo")(groups)
    with pytest.raises(InvalidRewardsError, match="remax needs baselines="):  # nor a greedy reward
        get_rllm_adv_estimator("remax")(groups)
    for name in ("reinforce_plus_plus", "gae", "optimal_token_baseline"):
        with pytest.raises(ConfigError, match="token-level"):
            get_rllm_adv_estimator(name)
        assert callable(get_tensor_adv_estimator(name))


def test_the_rllm_form_of_a_tensor_estimator_passes_the_options_it_declares_and_refuses_unknown_ones():
    fn = get_rllm_adv_estimator("test_both_ways_tensor")
    adv, _ = fn(GROUPS, epsilon=1.0, norm_adv_by_std_in_grpo=False)  # a run-wide option it does not take: accepted
    np.testing.assert_allclose(adv[0], (GROUPS[0] - GROUPS[0].mean()) / 2.0)
    with pytest.raises(ConfigError, match="takes no option 'unknown_option'"):
        fn(GROUPS, epsilon=1.0, unknown_option=3)


def test_the_tensor_form_of_a_builtin_is_its_tensor_implementation():
    from rllm_torch import grpo

    assert get_tensor_adv_estimator("grpo") is grpo


@pytest.mark.parametrize(
    ("groups", "dtype"),
    [
        ([np.array([1.0, 0.0]), np.array([0.5, 0.5])], np.float64),  # equal groups: one [G, K] array
        ([np.array([1.0, 0.0], dtype=np.float32), np.array([0.5], dtype=np.float32)], np.float32),
        ([[1.0, 0.0, 1.0], [0.0]], np.float64),  # Python floats, like numpy
        ([np.array([True, False]), np.array([True])], np.float32),
        ([np.array([3, 1]), np.array([2, 2])], np.float32),
    ],
)
def test_the_list_api_packs_on_numpy_and_keeps_rllm_dtypes(groups, dtype):
    adv, ret = calculate_grpo_advantages(groups)
    assert adv is ret and len(adv) == len(groups)
    for a, g in zip(adv, groups, strict=True):
        assert a.dtype == dtype and a.shape == (len(g),)
    general = GroupedRewards.from_groups([np.asarray(g) for g in groups])
    want, _ = compute_advantages(general, "grpo")
    np.testing.assert_allclose(np.concatenate(adv), want.numpy(), rtol=1e-6)
