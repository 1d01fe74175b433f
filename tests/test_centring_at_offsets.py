"""Centring is exact at any offset, on every path: rewards ``1e4 + 0.01 u`` in float32 and
``1e8 + 1e-5 u`` in float64 give ``r - mean`` within a few ulps *of the result* (never of the
offset), against exact rational arithmetic on the values as stored. Rounding the group mean to
the input dtype before the subtraction errs by up to half an ulp of the offset (4.9e-4 in
float32 at 1e4, 7.5e-9 in float64 at 1e8): 1e3-1e5 times these tolerances.

Paths: dense ``[G, K]`` and ragged layouts, rLLM's list API, the collector, the trainer's token
batch, ``torch.compile(fullgraph=True)``, and groups split over two gloo ranks (with batch
statistics merged across them); the batch-wide centring of ``prpo`` and the token whitening too.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import rank_tasks
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_pool import RankPool

from rllm_torch import (
    AlgorithmConfig,
    GroupedRewards,
    Trajectory,
    TrajectoryGroup,
    calculate_grpo_advantages,
    collect_reward_and_advantage_from_trajectory_groups,
    compute_advantages,
    masked_whiten,
)
from rllm_torch.rllm.types import Step
from rllm_torch.trainer import compute_token_advantages
from rllm_torch.trainer.pipeline.token_batch import build_token_batch

OFFSETS = {"float32": (1e4, 1e-2), "float64": (1e8, 1e-5)}  # (offset, spread)
NP = {"float32": np.float32, "float64": np.float64}
TORCH = {"float32": torch.float32, "float64": torch.float64}
DR_GRPO = {"norm_adv_by_std_in_grpo": False}


@st.composite
def offset_groups(draw, dtype: str, max_groups: int = 5) -> list[list[float]]:
    """Groups of 1-9 rewards ``offset + spread * u`` as stored in ``dtype`` (some constant)."""
    offset, spread = OFFSETS[dtype]
    groups = []
    for _ in range(draw(st.integers(1, max_groups))):
        size = draw(st.integers(1, 9))
        if draw(st.integers(0, 4)) == 0:  # a constant group
            values = [offset + spread * draw(st.integers(0, 1000)) / 1000] * size
        else:
            values = [offset + spread * draw(st.integers(0, 1000)) / 1000 for _ in range(size)]
        groups.append([float(NP[dtype](v)) for v in values])  # the values as stored
    return groups


def exact_deviations(group: list[float]) -> list[Fraction]:
    """``r - mean`` in exact rational arithmetic; a group of one keeps its reward (baseline 0)."""
    values = [Fraction(v) for v in group]
    mean = sum(values) / len(values) if len(values) > 1 else Fraction(0)
    return [v - mean for v in values]


def assert_centred(got: np.ndarray, group: list[float], dtype: str, scale: float = 1.0) -> None:
    """``got`` (one group's output, in order) equals ``scale * (r - mean)`` within ``n`` ulps, in
    ``dtype``, of the group's largest deviation; a constant group exactly 0."""
    want = [float(d) * scale for d in exact_deviations(group)]
    largest = max(abs(w) for w in want)
    tol = len(group) * float(np.spacing(NP[dtype](largest))) if largest else 0.0
    err = max(abs(g - w) for g, w in zip(got.tolist(), want, strict=True))
    assert err <= tol, f"error {err:.3g} > {tol:.3g} (n={len(group)}, {dtype}); got {got}, want {want}"


def grpo_reference(group: list[float], epsilon: float = 1e-6) -> list[float]:
    """rLLM's GRPO from exact deviations: ``(r - mean) / (std + epsilon)``; a group of one
    ``r / (1 + epsilon)``."""
    devs = exact_deviations(group)
    if len(group) == 1:
        return [float(devs[0]) / (1 + epsilon)]
    std = math.sqrt(float(sum(d * d for d in devs) / len(devs)))
    return [float(d) / (std + epsilon) for d in devs]


def _flat(groups: list[list[float]], dtype: str, interleave: bool) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Flat rewards and group ids, group-major or interleaved; ``order`` lists (group, member)."""
    order = [(g, j) for g, group in enumerate(groups) for j in range(len(group))]
    if interleave:
        order.sort(key=lambda gj: (gj[1], gj[0]))
    rewards = torch.tensor([groups[g][j] for g, j in order], dtype=torch.float64).to(TORCH[dtype])
    return rewards, torch.tensor([g for g, _ in order]), order


def _by_group(values: np.ndarray, groups: list[list[float]], order: list) -> list[np.ndarray]:
    out = [np.zeros(len(g)) for g in groups]
    for v, (g, j) in zip(values.tolist(), order, strict=True):
        out[g][j] = v
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layout", ["dense", "ragged group-major", "ragged interleaved"])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_centring_is_exact_at_large_offsets(dtype, layout, data):
    groups = data.draw(offset_groups(dtype))
    if layout == "dense":
        size = len(groups[0])
        groups = [(g * size)[:size] for g in groups]  # equal sizes
        batch = GroupedRewards.from_padded(torch.tensor(groups, dtype=torch.float64).to(TORCH[dtype]))
        order = [(g, j) for g in range(len(groups)) for j in range(size)]
        assert batch.layout.is_dense
    else:
        rewards, index, order = _flat(groups, dtype, interleave=layout.endswith("interleaved"))
        batch = GroupedRewards.from_flat(rewards, index, num_groups=len(groups))
    centred, _ = compute_advantages(batch, "grpo", **DR_GRPO)
    rloo, _ = compute_advantages(batch, "rloo")
    grpo, _ = compute_advantages(batch, "grpo")
    assert centred.dtype == TORCH[dtype]
    for g, (c, r, a) in enumerate(
        zip(*(_by_group(x.double().numpy(), groups, order) for x in (centred, rloo, grpo)), strict=True)
    ):
        n = len(groups[g])
        assert_centred(c, groups[g], dtype)
        assert_centred(r, groups[g], dtype, scale=n / (n - 1) if n > 1 else 1.0)
        # GRPO divides by a std of about 3e-3 (float32) or 3e-6 (float64): a mean rounded at the
        # offset errs there by up to 0.2 and 3e-3; the atol is 2e3 times smaller
        tol = dict(rtol=1e-6, atol=1e-4) if dtype == "float32" else dict(rtol=1e-13, atol=1e-9)  # rtol: singletons
        np.testing.assert_allclose(a, grpo_reference(groups[g]), **tol)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_batch_wide_centring_of_prpo_is_exact_at_large_offsets(dtype, data):
    groups = data.draw(offset_groups(dtype))
    rewards, index, _ = _flat(groups, dtype, interleave=False)
    got, _ = compute_advantages(GroupedRewards.from_flat(rewards, index), "prpo")
    flat = [v for g in groups for v in g]
    values = [Fraction(v) for v in flat]
    devs = [v - sum(values) / len(values) for v in values]
    std = math.sqrt(float(sum(d * d for d in devs) / len(devs)))
    want = [float(d) / (std + 1e-6) for d in devs]
    np.testing.assert_allclose(got.double().numpy(), want, rtol=0, atol=1e-4 if dtype == "float32" else 1e-9)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_rllm_list_api_is_exact_at_large_offsets(dtype, data):
    groups = data.draw(offset_groups(dtype))
    arrays = [np.array(g, dtype=NP[dtype]) for g in groups]
    adv_by_group, _ = calculate_grpo_advantages(arrays, norm_adv_by_std_in_grpo=False)
    for adv, group in zip(adv_by_group, groups, strict=True):
        assert_centred(np.asarray(adv, dtype=np.float64), group, dtype)


def _trajectory_groups(groups: list[list[float]]) -> list[TrajectoryGroup]:
    return [
        TrajectoryGroup(
            [Trajectory(name="solver", reward=r, steps=[Step(prompt_ids=[1, 2], response_ids=[3, 4])]) for r in group],
            group_id=f"task-{g}",
            task_id=f"task-{g}",
        )
        for g, group in enumerate(groups)
    ]


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_collector_is_exact_at_large_offsets(data):
    groups = data.draw(offset_groups("float64"))
    trajectory_groups = _trajectory_groups(groups)
    collect_reward_and_advantage_from_trajectory_groups(trajectory_groups, AlgorithmConfig(estimator="grpo", **DR_GRPO))
    for group, tg in zip(groups, trajectory_groups, strict=True):
        assert_centred(np.array([t.steps[0].advantage for t in tg.trajectories]), group, "float64")


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_trainer_token_batch_is_exact_at_large_offsets(data):
    """float64 statistics, float32 token advantages: each token is the exact deviation rounded
    once to float32 (a float64 mean rounded before the subtraction errs by 7.5e-9 at 1e8, 2e-4
    of a deviation of 1e-5 in float32's 1.2e-7)."""
    groups = data.draw(offset_groups("float64"))
    batch = build_token_batch(_trajectory_groups(groups), pad_token_id=0)
    compute_token_advantages(batch, AlgorithmConfig(estimator="grpo", **DR_GRPO))
    got = batch.advantages[:, 2:].double().numpy()  # the two response tokens of each row
    assert np.array_equal(got[:, 0], got[:, 1])
    row = 0
    for group in groups:
        assert_centred(got[row : row + len(group), 0], group, "float32")
        row += len(group)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_centring_is_exact_at_large_offsets(dtype):
    """``torch.compile(fullgraph=True)``, dense and ragged (float32 on CPU takes the corrected
    two-pass float32 mean); groups of 7, one of them constant."""
    offset, spread = OFFSETS[dtype]
    rng = np.random.default_rng(5)
    groups = [[float(NP[dtype](offset + spread * u)) for u in rng.random(7)] for _ in range(5)]
    groups.append([float(NP[dtype](offset + spread / 3))] * 7)
    padded = torch.tensor(groups, dtype=torch.float64).to(TORCH[dtype])

    def dense(r):
        return compute_advantages(GroupedRewards.from_padded(r, validate=False), "grpo", **DR_GRPO)[0]

    def ragged(r, i):
        return compute_advantages(GroupedRewards.from_flat(r, i, num_groups=6, validate=False), "grpo", **DR_GRPO)[0]

    got_dense = torch.compile(dense, fullgraph=True)(padded).view(6, 7)
    rewards, index, order = _flat(groups, dtype, interleave=True)
    got_ragged = _by_group(torch.compile(ragged, fullgraph=True)(rewards, index).double().numpy(), groups, order)
    for g, group in enumerate(groups):
        assert_centred(got_dense[g].double().numpy(), group, dtype)
        assert_centred(got_ragged[g], group, dtype)


def _token_values(dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[6, 5]`` values ``offset + spread * u`` in ``dtype``, a mask, and their exact whitening."""
    rng = np.random.default_rng(seed)
    offset, spread = OFFSETS[dtype]
    values = (offset + spread * rng.random((6, 5))).astype(NP[dtype])
    mask = (rng.random((6, 5)) < 0.7).astype(NP[dtype])
    trained = [Fraction(float(v)) for v, m in zip(values.ravel(), mask.ravel(), strict=True) if m]
    mean = sum(trained) / len(trained)
    std = math.sqrt(float(sum((v - mean) ** 2 for v in trained) / len(trained)))
    want = np.array([float(Fraction(float(v)) - mean) / (std + 1e-6) for v in values.ravel()]).reshape(6, 5) * mask
    return values, mask, want


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_token_whitening_is_exact_at_large_offsets(dtype):
    """``masked_whiten`` of float32 values ``1e4 + 0.01 u`` (e.g. returns) and float64 ones at
    ``1e8``: the mean is not rounded to the values' dtype before the subtraction."""
    values, mask, want = _token_values(dtype, seed=0)
    got = masked_whiten(torch.from_numpy(values), torch.from_numpy(mask)).double().numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 if dtype == "float32" else 1e-9)


# ---- across two gloo ranks -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(2)
    yield ranks
    ranks.close()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("local", [False, True], ids=["split groups", "rank-local groups"])
def test_centring_across_ranks_is_exact_at_large_offsets(pool, dtype, local):
    """Groups split over the ranks (the max as the shared shift) or whole on one rank; ``prpo``'s
    batch mean merged across them from each rank's (count, shift, mean - shift, M2)."""
    rng = np.random.default_rng(7)
    offset, spread = OFFSETS[dtype]
    groups = [[float(NP[dtype](offset + spread * u)) for u in rng.random(size)] for size in (5, 2, 7, 4, 6)]
    groups[3] = [groups[3][0]] * 4  # a constant group
    index = np.repeat(np.arange(len(groups)), [len(g) for g in groups])
    flat = [v for g in groups for v in g]
    owner = index % 2 if local else np.arange(index.size) % 2
    specs = []
    for r in range(2):
        ids = index[owner == r]
        ids = np.unique(ids, return_inverse=True)[1] if local else ids
        specs.append(
            dict(
                kind="flat",
                rewards=[v for v, o in zip(flat, owner, strict=True) if o == r],
                index=ids.tolist(),
                num_groups=int(ids.max()) + 1 if local else len(groups),
                dtype=dtype,
                local=local,
            )
        )
    centred = pool.run_ok(rank_tasks.estimate, [(s, "grpo", DR_GRPO) for s in specs])
    prpo = pool.run_ok(rank_tasks.estimate, [(s, "prpo", {}) for s in specs])
    got = np.zeros(index.size)
    got_prpo = np.zeros(index.size)
    for r in range(2):
        got[owner == r] = centred[r][0]
        got_prpo[owner == r] = prpo[r][0]
    for g, group in enumerate(groups):
        assert_centred(got[index == g], group, dtype)
    values = [Fraction(v) for v in flat]
    devs = [v - sum(values) / len(values) for v in values]
    std = math.sqrt(float(sum(d * d for d in devs) / len(devs)))
    want = [float(d) / (std + 1e-6) for d in devs]
    np.testing.assert_allclose(got_prpo, want, rtol=0, atol=1e-4 if dtype == "float32" else 1e-9)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_token_whitening_across_ranks_is_exact_at_large_offsets(pool, dtype):
    """Rows 0-1 on rank 0, rows 2-5 on rank 1: the merged mean is centred against the shared shift."""
    values, mask, want = _token_values(dtype, seed=1)
    parts = [slice(0, 2), slice(2, 6)]
    args = [(values[p].ravel().tolist(), mask[p].ravel().tolist(), 5, dtype) for p in parts]
    for p, got in zip(parts, pool.run_ok(rank_tasks.whiten_tokens, args), strict=True):
        np.testing.assert_allclose(got, want[p], rtol=0, atol=1e-4 if dtype == "float32" else 1e-9)
