"""The estimators verl's and TRL's users have: TRL's ``scale_rewards="batch"`` (GRPO with the
batch std), verl's ``grpo_passk`` (best versus second) and ``gpg``, and GDPO (TRL's
``normalize_then_sum``): hand-worked tables, float64 loop references (``tests/reference.py``),
dense = ragged, compiled graphs and bad input. Across ranks: ``test_distributed_new_estimators.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import gdpo_reference, reference_advantages

from rllm_torch import GroupedRewards, compute_advantages
from rllm_torch.core.errors import ConfigError, InvalidRewardsError

settings.register_profile("peers", max_examples=40, deadline=None)


@st.composite
def grouped(draw, max_groups: int = 6, columns: int = 0):
    """Ragged groups of rewards (quarters, so ties happen) and, with ``columns``, ``[n_g, R]``."""
    value = st.integers(-8, 8).map(lambda v: v / 4)
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=max_groups))
    groups = [[draw(value) for _ in range(n)] for n in sizes]
    if not columns:
        return groups
    return groups, [[[draw(value) for _ in range(columns)] for _ in range(n)] for n in sizes]


def _flat(groups):
    rewards = torch.tensor([v for g in groups for v in g], dtype=torch.float64)
    index = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
    return rewards, index


def _check(got: torch.Tensor, want: list[np.ndarray], **tol):
    np.testing.assert_allclose(got.numpy(), np.concatenate(want), **(tol or dict(rtol=1e-9, atol=1e-9)))


# ---- scale_rewards="batch" ---------------------------------------------------------------------


def test_grpo_with_the_batch_std_hand_table():
    # rewards [1, 0 | 1, 1 | 0.5]: group means 0.5, 1, (a group of one: 0); the batch's population
    # std of [1, 0, 1, 1, 0.5]: mean 0.7, var (0.09 + 0.49 + 0.09 + 0.09 + 0.04) / 5 = 0.16, std 0.4
    batch = GroupedRewards.from_groups([[1.0, 0.0], [1.0, 1.0], [0.5]])
    adv, _ = compute_advantages(batch, "grpo", scale_rewards="batch", epsilon=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.25, -1.25, 0.0, 0.0, 1.25], dtype=torch.float64))
    assert torch.equal(adv[2:4], torch.zeros(2, dtype=torch.float64))  # a constant group: exactly 0
    per_group, _ = compute_advantages(batch, "grpo", epsilon=0.0)
    assert per_group[0].item() == pytest.approx(1.0)  # group scale: (1 - 0.5) / 0.5


@settings(settings.get_profile("peers"))
@given(groups=grouped(), correction=st.sampled_from([0, 1]))
def test_grpo_with_the_batch_std_matches_a_float64_loop(groups, correction):
    if sum(map(len, groups)) <= correction:
        return
    rewards, index = _flat(groups)
    got, _ = compute_advantages(
        GroupedRewards.from_flat(rewards, index), "grpo", scale_rewards="batch", std_correction=correction
    )
    _check(got, reference_advantages("grpo", groups, scale_rewards="batch", std_correction=correction))


def test_grpo_scale_rewards_refuses_what_it_cannot_do():
    batch = GroupedRewards.from_groups([[1.0, 0.0]])
    with pytest.raises(InvalidRewardsError, match="TRL's 'none' is norm_adv_by_std_in_grpo=False"):
        compute_advantages(batch, "grpo", scale_rewards="none")
    with pytest.raises(InvalidRewardsError, match="set only one"):
        compute_advantages(batch, "grpo", scale_rewards="batch", norm_adv_by_std_in_grpo=False)
    nan, _ = compute_advantages(
        GroupedRewards.from_groups([[1.0, math.nan], [0.0, 1.0]]), "grpo", scale_rewards="batch"
    )
    assert torch.isnan(nan).all()  # the batch std is batch-wide


# ---- grpo_passk ---------------------------------------------------------------------------------


def test_grpo_passk_hand_table():
    # [0.2, 0.9, 0.5]: 0.9 - 0.5 = 0.4 on the best; [1, 1, 0]: a tied maximum, all 0; [0.7]: a group
    # of one, baseline 0: 0.7;  [nan, 1]: NaN throughout.  With the std (population):
    # group 0's std is sqrt(((1/3)^2 + (11/30)^2 + (1/30)^2) / 3) = 0.28674
    groups = [[0.2, 0.9, 0.5], [1.0, 1.0, 0.0], [0.7], [math.nan, 1.0]]
    adv, _ = compute_advantages(GroupedRewards.from_groups(groups), "grpo_passk", norm_adv_by_std_in_grpo=False)
    want = [0.0, 0.4, 0.0, 0.0, 0.0, 0.0, 0.7, math.nan, math.nan]
    torch.testing.assert_close(adv, torch.tensor(want, dtype=torch.float64), equal_nan=True)
    scaled, _ = compute_advantages(GroupedRewards.from_groups(groups[:3]), "grpo_passk")
    assert scaled[1].item() == pytest.approx(0.4 / (0.28674 + 1e-6), rel=1e-4)
    assert scaled[6].item() == pytest.approx(0.7 / (1 + 1e-6))  # std 1 for a group of one


@settings(settings.get_profile("peers"))
@given(groups=grouped(), norm=st.booleans(), correction=st.sampled_from([0, 1]))
def test_grpo_passk_matches_a_float64_loop_and_the_dense_path(groups, norm, correction):
    rewards, index = _flat(groups)
    options = dict(norm_adv_by_std_in_grpo=norm, std_correction=correction)
    got, _ = compute_advantages(GroupedRewards.from_flat(rewards, index), "grpo_passk", **options)
    want = reference_advantages("grpo_passk", groups, **options)
    _check(got, want)
    width = len(groups[0])
    dense = [(g * width)[:width] for g in groups]  # equal sizes: the [G, K] path
    got_dense, _ = compute_advantages(GroupedRewards.from_padded(torch.tensor(dense)), "grpo_passk", **options)
    _check(got_dense.double(), reference_advantages("grpo_passk", dense, **options), rtol=1e-5, atol=1e-5)


# ---- gpg ------------------------------------------------------------------------------------------


def test_gpg_hand_table():
    # [1, 0, 0, 0 | 0, 0 | 3]: 2 of 7 nonzero, alpha = 7 / 2; means 0.25, 0, (a group of one: 0)
    adv, _ = compute_advantages(GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0], [3.0]]), "gpg")
    want = torch.tensor([0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 3.0], dtype=torch.float64) * 3.5
    torch.testing.assert_close(adv, want)
    none, _ = compute_advantages(GroupedRewards.from_groups([[0.0, 0.0]]), "gpg")
    assert torch.equal(none, torch.zeros(2, dtype=torch.float64))  # no nonzero reward: alpha = B, A = 0


@settings(settings.get_profile("peers"))
@given(groups=grouped())
def test_gpg_matches_a_float64_loop(groups):
    rewards, index = _flat(groups)
    got, _ = compute_advantages(GroupedRewards.from_flat(rewards, index), "gpg")
    _check(got, reference_advantages("gpg", groups))


# ---- gdpo ----------------------------------------------------------------------------------------


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


@settings(settings.get_profile("peers"))
@given(data=grouped(columns=3), weights=st.one_of(st.none(), st.lists(st.floats(-2, 2), min_size=3, max_size=3)))
def test_gdpo_matches_a_float64_loop(data, weights):
    _, components = data
    got, _ = compute_advantages(_gdpo_batch(components), "gdpo", reward_weights=weights)
    want = gdpo_reference(components, weights)
    _check(got, want, rtol=1e-7, atol=1e-7)  # whitening a near-constant sum amplifies its rounding


def test_gdpo_float32_components_and_the_padded_layout():
    components = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]]])
    padded = GroupedRewards.from_padded(components[..., 0], reward_components=components)
    got, _ = compute_advantages(padded, "gdpo")
    assert got.dtype == torch.float32 and padded.layout.is_dense
    _check(got.double(), gdpo_reference([c.numpy() for c in components]), rtol=1e-5, atol=1e-5)


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


# ---- compiled ------------------------------------------------------------------------------------


def test_the_peer_estimators_compile_with_fullgraph():
    gen = torch.Generator().manual_seed(0)
    rewards = (torch.rand(6, 4, generator=gen) * 4).round() / 4  # ties, and a nonzero share below 1
    components = torch.rand(6, 4, 3, generator=gen)
    index = torch.arange(6).repeat_interleave(4)[torch.randperm(24, generator=gen)]
    flat = torch.rand(24, generator=gen)
    cases = {
        "grpo batch std": (lambda r: compute_advantages(GroupedRewards.from_padded(r, validate=False), "grpo",
                                                        scale_rewards="batch")[0], (rewards,)),
        "grpo_passk": (lambda r, i: compute_advantages(GroupedRewards.from_flat(r, i, num_groups=6, validate=False),
                                                       "grpo_passk")[0], (flat, index)),
        "gpg": (lambda r: compute_advantages(GroupedRewards.from_padded(r, validate=False), "gpg")[0], (rewards,)),
        "gdpo": (lambda r, c: compute_advantages(GroupedRewards.from_padded(r, validate=False, reward_components=c),
                                                 "gdpo", reward_weights=[1.0, 0.5, 2.0])[0], (rewards, components)),
    }  # fmt: skip
    for name, (fn, args) in cases.items():
        torch.testing.assert_close(torch.compile(fn, fullgraph=True)(*args), fn(*args), rtol=1e-5, atol=1e-5, msg=name)
