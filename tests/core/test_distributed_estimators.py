"""Estimators across real gloo ranks equal one process on the concatenated batch.

Hypothesis draws ragged batches and spreads them over 2 and 3 ranks (groups split over every
rank, a rank with no trajectory, a rank with only singletons, constant groups split over ranks,
NaN in one group); each rank's advantages must match the single-process result for its own
trajectories: within 1e-9 for float64, 2e-5 for float32/bfloat16 rewards (whose values here
are exact in bfloat16; the difference is the order of float32 additions), with exactly 0 for a
constant group of two or more.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import rank_tasks
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_pool import RankError, RankPool
from reference import BUILTINS

from rllm_torch import (
    AlgorithmConfig,
    DistributedSetupError,
    GroupedRewards,
    InvalidGroupIndexError,
    collect_reward_and_advantage_from_trajectory_groups,
    compute_advantages,
)

settings.register_profile("distributed", max_examples=30, deadline=None)


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def pool(request):
    ranks = RankPool(request.param)
    yield ranks
    ranks.close()


# ---- batches ---------------------------------------------------------------------------------


@st.composite
def global_groups(draw, max_groups: int = 8):
    """``(groups, dtype)``: ragged groups of 1-9 rewards, some constant, sometimes one NaN."""
    dtype = draw(st.sampled_from(["float64", "float32", "bfloat16"]))
    value = st.floats(-1e3, 1e3, allow_nan=False) if dtype == "float64" else st.integers(-400, 400).map(lambda v: v / 4)
    group = st.one_of(
        st.lists(value, min_size=1, max_size=9),
        st.tuples(value, st.integers(2, 9)).map(lambda t: [t[0]] * t[1]),
    )
    groups = draw(st.lists(group, min_size=1, max_size=max_groups))
    if draw(st.integers(0, 5)) == 0:  # NaN in one group
        g = draw(st.integers(0, len(groups) - 1))
        groups[g][draw(st.integers(0, len(groups[g]) - 1))] = math.nan
    return groups, dtype


@st.composite
def placements(draw, groups: list[list[float]], world: int) -> list[list[int]]:
    """The rank of every trajectory: at random, all on one rank, round robin (every group on
    every rank), or the singleton groups alone on the last rank."""
    mode = draw(st.sampled_from(["random", "one_rank", "every_rank", "singletons_last"]))
    if mode == "random":
        return [[draw(st.integers(0, world - 1)) for _ in g] for g in groups]
    if mode == "one_rank":
        rank = draw(st.integers(0, world - 1))
        return [[rank] * len(g) for g in groups]
    if mode == "every_rank":
        start = draw(st.integers(0, world - 1))
        return [[(start + j) % world for j in range(len(g))] for g in groups]
    return [[world - 1] * len(g) if len(g) == 1 else [j % (world - 1) for j in range(len(g))] for g in groups]


def _reference(groups, dtype, estimator, options):
    """Single-process advantages of the whole batch, per group."""
    batch = GroupedRewards.from_groups(
        [torch.tensor(g, dtype=torch.float64).to(rank_tasks.DTYPES[dtype]) for g in groups]
    )
    adv, _ = compute_advantages(batch, estimator, **options)
    return [a.double().numpy() for a in batch.split(adv)]


def _check(got, want, dtype, out_dtype):
    assert out_dtype == ("torch.float64" if dtype == "float64" else "torch.float32")
    tol = dict(rtol=1e-9, atol=1e-9) if dtype == "float64" else dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got, want, equal_nan=True, **tol)


def _has_nan(groups) -> bool:
    return any(math.isnan(v) for g in groups for v in g)


def _assert_constant_groups_exactly_zero(groups, per_group_adv, estimator, nan_in_batch):
    """``nan_in_batch``: a NaN anywhere in the whole batch, which whitening spreads to every rank."""
    if estimator in ("grpo", "rloo") or (estimator == "reinforce_plus_plus_baseline" and not nan_in_batch):
        for g, adv in zip(groups, per_group_adv, strict=True):
            if len(g) >= 2 and not any(map(math.isnan, g)) and len(set(g)) == 1:
                assert np.all(adv == 0.0), (g, adv)


def _split_specs(groups, ranks, world, dtype, kind, rng):
    """Each rank's spec (split layout, global ids) and, per rank, the (group, member) of each of its
    trajectories in its flat order."""
    specs, members = [], []
    for r in range(world):
        mine = [(g, j) for g, group in enumerate(groups) for j in range(len(group)) if ranks[g][j] == r]
        if kind == "flat":
            mine = [mine[i] for i in rng.permutation(len(mine))]  # any order within the rank
            spec = dict(rewards=[groups[g][j] for g, j in mine], index=[g for g, _ in mine])
        else:  # every rank lists every group, with its own members (maybe none)
            spec = dict(groups=[[groups[g][j] for gg, j in mine if gg == g] for g in range(len(groups))])
        specs.append(dict(spec, kind=kind, num_groups=len(groups), dtype=dtype, local=False))
        members.append(mine)
    return specs, members


OPTIONS = st.fixed_dictionaries({"norm_adv_by_std_in_grpo": st.booleans(), "std_correction": st.sampled_from([0, 1])})


@settings(settings.get_profile("distributed"))
@given(data=st.data(), estimator=st.sampled_from(BUILTINS), options=OPTIONS, kind=st.sampled_from(["flat", "groups"]))
def test_split_groups_give_every_rank_the_single_process_advantages(pool, data, estimator, options, kind):
    groups, dtype = data.draw(global_groups())
    ranks = data.draw(placements(groups, pool.world_size))
    specs, members = _split_specs(groups, ranks, pool.world_size, dtype, kind, np.random.default_rng(0))
    results = pool.run_ok(rank_tasks.estimate, [(s, estimator, options) for s in specs])
    want = _reference(groups, dtype, estimator, options)
    got_by_group = [np.zeros(len(g)) for g in groups]
    for (adv, out_dtype, _), mine in zip(results, members, strict=True):
        _check(adv, np.array([want[g][j] for g, j in mine]), dtype, out_dtype)
        for a, (g, j) in zip(adv, mine, strict=True):
            got_by_group[g][j] = a
    _assert_constant_groups_exactly_zero(groups, got_by_group, estimator, _has_nan(groups))


@settings(settings.get_profile("distributed"))
@given(
    data=st.data(),
    estimator=st.sampled_from(BUILTINS),
    options=OPTIONS,
    dtype=st.sampled_from(["float64", "float32"]),
)
def test_split_equal_groups_from_padded_rows_match_one_process(pool, data, estimator, options, dtype):
    """Every rank holds ``K_r`` members of each of the same ``G`` groups (``[G, K_r]``, maybe ``K_r = 0``)."""
    num_groups = data.draw(st.integers(1, 6))
    widths = [data.draw(st.integers(0, 3)) for _ in range(pool.world_size)]
    value = st.integers(-40, 40).map(lambda v: v / 4)
    constant = data.draw(st.booleans())
    padded = []
    for width in widths:
        rows = [[data.draw(value) for _ in range(width)] for _ in range(num_groups)]
        padded.append([[1.5] * width for _ in rows] if constant else rows)
    specs = [
        dict(kind="padded", padded=p, shape=(num_groups, w), dtype=dtype, local=False)
        for p, w in zip(padded, widths, strict=True)
    ]
    results = pool.run_ok(rank_tasks.estimate, [(s, estimator, options) for s in specs])
    groups = [[v for p in padded for v in p[g]] for g in range(num_groups)]
    if not any(groups):
        return
    want = _reference(groups, dtype, estimator, options)
    for r, (adv, out_dtype, branch) in enumerate(results):
        assert branch == ("dense" if widths[r] else "ragged")
        offsets = [sum(widths[:r])] * num_groups
        expected = [want[g][offsets[g] + k] for g in range(num_groups) for k in range(widths[r])]
        _check(adv, np.array(expected), dtype, out_dtype)
        if constant and sum(widths) >= 2 and estimator != "reinforce":
            assert np.all(adv == 0.0)


@settings(settings.get_profile("distributed"))
@given(
    data=st.data(),
    estimator=st.sampled_from(BUILTINS),
    options=OPTIONS,
    kind=st.sampled_from(["flat", "groups", "padded"]),
)
def test_rank_local_groups_match_one_process(pool, data, estimator, options, kind):
    """Each group wholly on one rank, with that rank's own ids (the trainer's layout)."""
    if kind == "padded":  # equal groups: n rollouts per prompt
        size = data.draw(st.integers(1, 5))
        dtype = data.draw(st.sampled_from(["float64", "float32"]))
        per_rank = [
            [[data.draw(st.integers(-8, 8)) / 2 for _ in range(size)] for _ in range(data.draw(st.integers(0, 3)))]
            for _ in range(pool.world_size)
        ]
    else:
        groups, dtype = data.draw(global_groups())
        owner = [data.draw(st.integers(0, pool.world_size - 1)) for _ in groups]
        per_rank = [[g for g, o in zip(groups, owner, strict=True) if o == r] for r in range(pool.world_size)]
    specs = []
    for mine in per_rank:
        if kind == "flat":
            specs.append(
                dict(
                    rewards=[v for g in mine for v in g],
                    index=[i for i, g in enumerate(mine) for _ in g],
                    num_groups=len(mine),
                )
            )
        elif kind == "groups":
            specs.append(dict(groups=mine))
        else:
            specs.append(dict(padded=mine, shape=(len(mine), len(mine[0]) if mine else 0)))
        specs[-1] |= dict(kind=kind, dtype=dtype, local=True)
    results = pool.run_ok(rank_tasks.estimate, [(s, estimator, options) for s in specs])
    everything = [g for mine in per_rank for g in mine]
    if not everything:
        return
    want = _reference(everything, dtype, estimator, options)
    start = 0
    for mine, (adv, out_dtype, _) in zip(per_rank, results, strict=True):
        expected = [want[start + i] for i in range(len(mine))]
        start += len(mine)
        _check(adv, np.concatenate(expected) if expected else np.zeros(0), dtype, out_dtype)
        if mine:
            per_group = np.split(adv, np.cumsum([len(g) for g in mine])[:-1])
            _assert_constant_groups_exactly_zero(mine, per_group, estimator, _has_nan(everything))


@settings(settings.get_profile("distributed"))
@given(
    data=st.data(),
    estimator=st.sampled_from(["test_mean_abs_scaled", "test_distributed_max_baseline"]),
    local=st.booleans(),
)
def test_custom_estimators_are_correct_across_ranks(pool, data, estimator, local):
    """A tensor-form estimator written with the layout's reductions needs no distributed code; an
    rLLM-form one sees whole groups (the batch is gathered once)."""
    groups, _ = data.draw(global_groups())
    groups = [[0.0 if math.isnan(v) else v for v in g] for g in groups]
    if local:
        owner = [data.draw(st.integers(0, pool.world_size - 1)) for _ in groups]
        per_rank = [[g for g, o in zip(groups, owner, strict=True) if o == r] for r in range(pool.world_size)]
        specs = [dict(kind="groups", groups=mine, dtype="float64", local=True) for mine in per_rank]
        members = [
            [(g, j) for g, o in enumerate(owner) if o == r for j in range(len(groups[g]))]
            for r in range(pool.world_size)
        ]
    else:
        ranks = data.draw(placements(groups, pool.world_size))
        specs, members = _split_specs(groups, ranks, pool.world_size, "float64", "flat", np.random.default_rng(1))
    results = pool.run_ok(rank_tasks.estimate, [(s, estimator, {}) for s in specs])
    want = _reference(groups, "float64", estimator, {})
    for (adv, _, _), mine in zip(results, members, strict=True):
        np.testing.assert_allclose(adv, [want[g][j] for g, j in mine], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("estimator", ["prpo", "reinforce_plus_plus_baseline"])
def test_batch_statistics_keep_float32_precision_under_a_large_offset(pool, estimator):
    """Rewards around 1e4 in float32: the merged batch moments must be as accurate as one process's
    (per-rank float32 means would drop the low bits the spread lives in)."""
    g = torch.Generator().manual_seed(3)
    rewards = (1e4 + torch.rand(pool.world_size * 24, generator=g)).float()
    index = torch.arange(rewards.numel()) // 4
    specs = [
        dict(
            kind="flat",
            rewards=rewards[r :: pool.world_size].double().tolist(),
            index=index[r :: pool.world_size].tolist(),
            num_groups=int(index.max()) + 1,
            dtype="float32",
            local=False,
        )
        for r in range(pool.world_size)
    ]
    results = pool.run_ok(rank_tasks.estimate, [(s, estimator, {}) for s in specs])
    one = compute_advantages(GroupedRewards.from_flat(rewards, index), estimator)[0].double()
    exact = compute_advantages(GroupedRewards.from_flat(rewards.double(), index), estimator)[0]
    single_error = float((one - exact).abs().max())
    for r, (adv, _, _) in enumerate(results):
        error = float((torch.tensor(adv) - exact[r :: pool.world_size]).abs().max())
        assert error <= 4 * single_error + 1e-6, (error, single_error)


@pytest.mark.parametrize("estimator", ["prpo", "reinforce_plus_plus_baseline"])
def test_a_constant_batch_is_exactly_zero_with_an_empty_rank_0(pool, estimator):
    """Batch statistics merge per-rank moments; their reference must come from a rank with data
    (with rank 0's empty mean, 2/7 * 0.1 + 5/7 * 0.1 is not 0.1 in float32)."""
    sizes = [0, 2, 5, 1, 1][: pool.world_size]
    specs = [
        dict(kind="flat", rewards=[0.1] * n, index=[0] * n, num_groups=1, dtype="float32", local=False) for n in sizes
    ]
    for adv, _, _ in pool.run_ok(rank_tasks.estimate, [(s, estimator, {}) for s in specs]):
        assert np.all(adv == 0.0), adv


# ---- cost ------------------------------------------------------------------------------------

# (collective, numel, dtype) of one call on G = 5 groups. float32 rewards: the group means are
# float64 sums (exact for constant groups, no shift), fused with the counts ([2G]); float64
# rewards: first a shared shift (the group max, [G]), then the shifted sums and counts.
F32, F64 = "torch.float32", "torch.float64"
GROUP_CENTER = {F32: [("all_reduce", 10, F64)], F64: [("all_reduce", 5, F64), ("all_reduce", 10, F64)]}


def _expected(estimator: str, dtype: str, local: bool) -> list[tuple]:
    center = [] if local else GROUP_CENTER[dtype]
    var = [] if local else [("all_reduce", 5, dtype)]
    batch = [("all_gather", 4, F64)]  # every rank's (count, shift, mean - shift, M2), merged in float64
    return {
        "grpo": center + var,
        "rloo": center,
        "reinforce": [],
        "reinforce_plus_plus_baseline": center + batch,
        "prpo": batch,
    }[estimator]


@pytest.mark.parametrize("estimator", BUILTINS)
@pytest.mark.parametrize("kind", ["flat", "padded"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_estimator_call_makes_a_fixed_number_of_small_collectives(pool, estimator, kind, dtype):
    world = pool.world_size
    for n_per_rank in (2, 40):  # the calls do not depend on N
        if kind == "flat":
            specs = [
                dict(
                    kind="flat",
                    rewards=[float(i % 3) for i in range(n_per_rank)],
                    index=[i % 5 for i in range(n_per_rank)],
                    num_groups=5,
                )
                for _ in range(world)
            ]
        else:
            specs = [dict(kind="padded", padded=[[1.0, float(r)]] * 5, shape=(5, 2)) for r in range(world)]
        for local in (False, True):
            ranked = [dict(spec, dtype=dtype, local=local, validate=False) for spec in specs]
            for rank_calls in pool.run_ok(rank_tasks.count_collectives, [(s, estimator, {}) for s in ranked]):
                assert rank_calls == _expected(estimator, f"torch.{dtype}", local)
            # a validated batch adds one small agreement on the estimator and its options
            validated = [dict(s, validate=True) for s in ranked]
            for rank_calls in pool.run_ok(rank_tasks.count_collectives, [(s, estimator, {}) for s in validated]):
                assert rank_calls == [("all_gather_object", -1, "list")] + _expected(estimator, f"torch.{dtype}", local)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline", "prpo"])
@pytest.mark.parametrize("local", [False, True], ids=["split", "rank-local"])
def test_estimators_across_ranks_compile_with_fullgraph(pool, estimator, local):
    if pool.world_size != 2:
        pytest.skip("compiling is slow on 2 cores: once, on 2 ranks")
    # fused compiled arithmetic may round differently from eager in the last bit
    assert all(d <= 1e-6 for d in pool.run_ok(rank_tasks.compiled_matches_eager, [(estimator, local)] * 2))


# ---- bad input -------------------------------------------------------------------------------


def _errors(results):
    assert all(isinstance(r, RankError) for r in results), results
    return results


def _flat_spec(**over):
    return (
        dict(kind="flat", rewards=[1.0, 0.0, 1.0], index=[0, 1, 1], num_groups=2, dtype="float32", local=False) | over
    )


def test_different_num_groups_on_two_ranks_fail_on_every_rank(pool):
    specs = [_flat_spec()] * (pool.world_size - 1) + [_flat_spec(num_groups=3)]
    for err in _errors(pool.run(rank_tasks.build_only, [(s,) for s in specs])):
        assert err.type_name == "DistributedBatchError"
        assert (
            "num_groups" in err.message
            and "rank 0: 2" in err.message
            and f"rank {pool.world_size - 1}: 3" in err.message
        )


def test_an_id_out_of_range_on_one_rank_fails_on_every_rank_naming_it(pool):
    specs = [_flat_spec()] * pool.world_size
    specs[1] = _flat_spec(index=[0, 1, 2])
    for err in _errors(pool.run(rank_tasks.build_only, [(s,) for s in specs])):
        assert err.type_name == "InvalidGroupIndexError"
        assert "outside [0, 2)" in err.message
    assert "rank 1 of" in pool.run(rank_tasks.build_only, [(s,) for s in specs])[0].message


def test_different_reward_dtypes_fail_on_every_rank(pool):
    specs = [_flat_spec()] * (pool.world_size - 1) + [_flat_spec(dtype="float64")]
    for err in _errors(pool.run(rank_tasks.build_only, [(s,) for s in specs])):
        assert err.type_name == "DistributedBatchError" and "reward dtype" in err.message


def test_split_groups_without_num_groups_on_one_rank_fail_on_every_rank(pool):
    specs = [_flat_spec()] * (pool.world_size - 1) + [_flat_spec(num_groups=None)]
    for err in _errors(pool.run(rank_tasks.build_only, [(s,) for s in specs])):
        assert err.type_name == "InvalidGroupIndexError" and "num_groups is required" in err.message


def test_local_groups_on_some_ranks_only_fail_on_every_rank(pool):
    specs = [_flat_spec()] * (pool.world_size - 1) + [_flat_spec(local=True)]
    for err in _errors(pool.run(rank_tasks.build_only, [(s,) for s in specs])):
        assert err.type_name == "DistributedBatchError" and "local_groups" in err.message


def test_a_process_group_needs_torch_distributed_initialised():
    # torch.distributed.group.WORLD is None before init_process_group: None means WORLD here, so it fails
    rewards, index = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    for group in (None, torch.distributed.group.WORLD):
        with pytest.raises(DistributedSetupError, match="not initialised"):
            GroupedRewards.from_flat(rewards, index, num_groups=1, process_group=group)
    with pytest.raises(DistributedSetupError, match="not initialised"):
        GroupedRewards.from_padded(rewards[None], process_group=None)
    with pytest.raises(DistributedSetupError, match="not initialised"):
        collect_reward_and_advantage_from_trajectory_groups([], AlgorithmConfig(), process_group=None)


def test_a_batch_used_after_the_process_group_was_destroyed_is_refused(tmp_path):
    """torch's collectives quietly do nothing on a destroyed group: the batch would get this
    rank's statistics only."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        batch = GroupedRewards.from_flat(
            torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), num_groups=1, process_group=None
        )
    finally:
        dist.destroy_process_group()
    with pytest.raises(DistributedSetupError, match="shut down"):
        compute_advantages(batch, "grpo")


def test_local_groups_without_a_process_group_is_refused():
    with pytest.raises(InvalidGroupIndexError, match="local_groups=True describes a batch spread over a process group"):
        GroupedRewards.from_groups([[1.0, 0.0]], local_groups=True)


def test_something_else_than_a_process_group_is_refused(pool):
    for err in _errors(pool.run(rank_tasks.not_a_process_group, [()] * pool.world_size)):
        assert err.type_name == "DistributedSetupError" and "got str" in err.message


def test_different_estimators_on_the_ranks_of_a_validated_batch_fail_on_every_rank(pool):
    estimators = ["grpo", "prpo", "rloo"][: pool.world_size]
    for err in _errors(pool.run(rank_tasks.estimate_with, [(_flat_spec(), estimators)] * pool.world_size)):
        assert err.type_name == "DistributedBatchError" and "estimator differs" in err.message


def test_an_estimator_registered_on_one_rank_only_fails_on_every_rank(pool):
    for err in _errors(pool.run(rank_tasks.register_on_rank_0_only_and_estimate, [(_flat_spec(),)] * pool.world_size)):
        assert err.type_name == "UnknownEstimatorError" and "test_only_on_rank_0" in err.message


def test_a_rank_outside_the_process_group_is_told_so(pool):
    results = pool.run(rank_tasks.build_in_a_group_without_this_rank, [(_flat_spec(local=True),)] * pool.world_size)
    assert isinstance(results[1], RankError) and results[1].type_name == "DistributedSetupError"
    assert "not a member of the process group" in results[1].message


def test_the_pool_still_works_after_the_errors(pool):
    specs = [_flat_spec()] * pool.world_size
    results = pool.run_ok(rank_tasks.estimate, [(s, "grpo", {}) for s in specs])
    want = _reference([[1.0] * pool.world_size, [0.0, 1.0] * pool.world_size], "float32", "grpo", {})
    for adv, _, _ in results:
        np.testing.assert_allclose(adv, [want[0][0], want[1][0], want[1][1]], rtol=1e-6)
