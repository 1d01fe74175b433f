"""Properties against the per-group float64 oracle, on random ragged batches (hypothesis)."""

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import BUILTINS, GROUP_WISE, reference_advantages

from rllm_torch import GroupedRewards, compute_advantages

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.int64, torch.bool]
settings.register_profile("ci", max_examples=60, deadline=None)
settings.load_profile("ci")


@st.composite
def batches(draw, min_size=1):
    """(per-group rewards rounded to the dtype, dtype): ragged sizes 1-9, some constant groups."""
    dtype = draw(st.sampled_from(DTYPES))
    if dtype == torch.bool:
        value = st.booleans().map(float)
    elif dtype == torch.int64:
        value = st.integers(-5, 5).map(float)
    elif dtype == torch.float64:
        value = st.floats(-1e3, 1e3, allow_nan=False)
    else:
        value = st.integers(-400, 400).map(lambda v: v / 4)
    group = st.one_of(
        st.lists(value, min_size=1, max_size=9),
        st.tuples(value, st.integers(2, 9)).map(lambda t: [t[0]] * t[1]),  # constant group
    )
    groups = draw(st.lists(group, min_size=min_size, max_size=10))
    return [torch.tensor(g, dtype=torch.float64).to(dtype) for g in groups], dtype


def _tolerance(dtype):
    return dict(rtol=1e-9, atol=1e-9) if dtype == torch.float64 else dict(rtol=2e-5, atol=2e-5)


def _flat(groups):
    rewards = torch.cat(groups)
    index = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
    return rewards, index


@given(batches(min_size=0), st.sampled_from(BUILTINS), st.booleans(), st.sampled_from([0, 1]))
def test_every_builtin_matches_the_float64_oracle(data, estimator, norm, correction):
    groups, dtype = data
    options = dict(norm_adv_by_std_in_grpo=norm, std_correction=correction)
    want = reference_advantages(estimator, [g.double().numpy() for g in groups], **options)
    got, ret = compute_advantages(GroupedRewards.from_groups(groups), estimator, **options)
    if groups:  # an empty list has no dtype: it packs as float64, like Python floats
        assert got.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    want_flat = np.concatenate(want) if want else np.zeros(0)
    np.testing.assert_allclose(got.double().numpy(), want_flat, **_tolerance(dtype))
    assert torch.equal(got, ret)


@given(batches(), st.sampled_from(BUILTINS), st.randoms(use_true_random=False))
def test_permuting_trajectories_permutes_the_advantages(data, estimator, rnd):
    groups, dtype = data
    rewards, index = _flat(groups)
    perm = list(range(rewards.numel()))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    base, _ = compute_advantages(GroupedRewards.from_flat(rewards, index), estimator)
    shuffled, _ = compute_advantages(
        GroupedRewards.from_flat(rewards[perm], index[perm], num_groups=len(groups)), estimator
    )
    torch.testing.assert_close(shuffled, base[perm], **_tolerance(dtype))


@given(batches(), st.sampled_from(["grpo", "rloo"]))
def test_group_advantages_average_to_zero(data, estimator):
    groups, dtype = data
    batch = GroupedRewards.from_groups(groups)
    adv, _ = compute_advantages(batch, estimator)
    for rewards, group_adv in zip(groups, batch.split(adv), strict=True):
        if len(rewards) >= 2:
            scale = max(1.0, float(group_adv.abs().max()))
            assert abs(float(group_adv.double().mean())) <= 1e-5 * scale * len(rewards)


@given(batches(), st.sampled_from(["grpo", "rloo", "reinforce_plus_plus_baseline"]))
def test_constant_groups_are_exactly_zero_on_every_path(data, estimator):
    groups, dtype = data
    rewards, index = _flat(groups)
    constant = [len(g) >= 2 and bool((g == g[0]).all()) for g in groups]
    for batch in (GroupedRewards.from_groups(groups), GroupedRewards.from_flat(rewards.flip(0), index.flip(0))):
        adv, _ = compute_advantages(batch, estimator)
        if batch.group_major:
            per_group = batch.split(adv)
        else:
            per_group = [adv.flip(0)[index == g] for g in range(len(groups))]
        for is_constant, group_adv in zip(constant, per_group, strict=True):
            if is_constant:
                assert torch.equal(group_adv, torch.zeros_like(group_adv))


@given(batches(), batches(), st.sampled_from(GROUP_WISE))
def test_concatenating_two_batches_concatenates_their_results(a, b, estimator):
    (ga, _), (gb, _) = a, b
    ga, gb = [g.double() for g in ga], [g.double() for g in gb]
    left, _ = compute_advantages(GroupedRewards.from_groups(ga), estimator)
    right, _ = compute_advantages(GroupedRewards.from_groups(gb), estimator)
    both, _ = compute_advantages(GroupedRewards.from_groups(ga + gb), estimator)
    torch.testing.assert_close(both, torch.cat([left, right]))


@given(st.integers(1, 6), st.integers(1, 9), st.sampled_from(BUILTINS), st.integers(0, 2**31 - 1))
def test_dense_path_equals_ragged_path(num_groups, group_size, estimator, seed):
    rewards = torch.randn(num_groups, group_size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    dense = GroupedRewards.from_padded(rewards)
    ragged = GroupedRewards.from_flat(rewards.reshape(-1), dense.group_index, num_groups=num_groups)
    assert dense.layout.is_dense and not ragged.layout.is_dense
    torch.testing.assert_close(
        compute_advantages(dense, estimator)[0], compute_advantages(ragged, estimator)[0], rtol=1e-12, atol=1e-12
    )


@given(batches(), st.floats(-1e3, 1e3), st.sampled_from(["grpo", "rloo"]))
def test_shifting_a_group_leaves_its_advantages_unchanged(data, offset, estimator):
    groups, _ = data
    groups = [g.double() for g in groups]
    base, _ = compute_advantages(GroupedRewards.from_groups(groups), estimator)
    shifted, _ = compute_advantages(GroupedRewards.from_groups([groups[0] + offset] + groups[1:]), estimator)
    n = len(groups[0])
    if n >= 2:
        torch.testing.assert_close(shifted[:n], base[:n], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(shifted[n:], base[n:])
