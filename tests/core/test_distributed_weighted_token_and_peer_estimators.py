"""OPO's weighted group means, pass@k's checks and the token-level whitening across real gloo
ranks: every rank gets the single-process numbers for its own part of the batch, and an input
error found on one rank is raised on every rank (none waits)."""

from __future__ import annotations

import numpy as np
import pytest
import rank_tasks
import torch
from rank_pool import RankPool

from rllm_torch import GroupedRewards, TokenRewards, compute_advantages


@pytest.fixture(scope="module")
def pool():
    ranks = RankPool(2)
    yield ranks
    ranks.close()


def _weighted_batch(seed: int):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 7, size=9)
    index = np.repeat(np.arange(len(sizes)), sizes)
    rewards = rng.normal(size=index.size) * 10 + 1e3
    weights = rng.integers(1, 40, size=index.size).astype(np.float64)
    rewards[index == 2] = 5.0  # a constant group
    return rewards, index, weights


@pytest.mark.parametrize("local", [False, True], ids=["split groups", "rank-local groups"])
def test_opo_across_ranks_equals_one_process(pool, local):
    rewards, index, weights = _weighted_batch(seed=3)
    one = GroupedRewards.from_flat(torch.tensor(rewards), torch.tensor(index), weights=torch.tensor(weights))
    want, _ = compute_advantages(one, "opo")
    # split: trajectories alternate between the ranks; rank-local: whole groups alternate
    owner = index % 2 if local else np.arange(index.size) % 2
    specs = [
        dict(
            rewards=rewards[owner == r].tolist(),
            index=index[owner == r].tolist(),
            weights=weights[owner == r].tolist(),
            num_groups=9,
            local=local,
        )
        for r in range(2)
    ]
    results = pool.run_ok(rank_tasks.estimate_weighted, [(s, "opo", {}) for s in specs])
    for r, got in enumerate(results):
        np.testing.assert_allclose(got, want.numpy()[owner == r], rtol=1e-9, atol=1e-9)
        assert np.all(got[index[owner == r] == 2] == 0.0)  # the constant group: exactly 0 on both ranks


@pytest.mark.parametrize(
    "estimator, options", [("reinforce_plus_plus", {"gamma": 0.9}), ("gae", {"gamma": 0.99, "lam": 0.95})]
)
def test_token_level_whitening_is_over_every_ranks_tokens(pool, estimator, options):
    gen = torch.Generator().manual_seed(1)
    rewards, values = (
        torch.randn(7, 5, generator=gen, dtype=torch.float64),
        torch.randn(7, 5, generator=gen, dtype=torch.float64),
    )
    mask = (torch.rand(7, 5, generator=gen) > 0.3).double()
    want_adv, want_returns = compute_advantages(TokenRewards(rewards, mask, values=values), estimator, **options)
    parts = [slice(0, 2), slice(2, 7)]  # ranks with different row counts
    args = [
        (
            rewards[p].reshape(-1).tolist(),
            mask[p].reshape(-1).tolist(),
            values[p].reshape(-1).tolist(),
            estimator,
            dict(options, width=5),
        )
        for p in parts
    ]
    for p, (adv, returns) in zip(parts, pool.run_ok(rank_tasks.estimate_tokens, args), strict=True):
        np.testing.assert_allclose(adv, want_adv[p].numpy(), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(returns, want_returns[p].numpy(), rtol=1e-9, atol=1e-9)


def test_a_pass_at_k_input_error_on_one_rank_is_raised_on_every_rank(pool):
    specs = [
        dict(kind="groups", groups=[[1.0, 0.0, 0.0]], num_groups=1, dtype="float64", local=True),
        dict(kind="groups", groups=[[1.0, 0.5, 0.0]], num_groups=1, dtype="float64", local=True),  # not binary
    ]
    errors = pool.run(rank_tasks.error_of, [(s, "pass_at_k", {"k": 2}) for s in specs])
    assert all("binary" in e for e in errors), errors
    specs[1] = dict(specs[1], groups=[[1.0]])  # a group smaller than k
    errors = pool.run(rank_tasks.error_of, [(s, "pass_at_k", {"k": 2}) for s in specs])
    assert all("has 1 trajectory" in e for e in errors), errors


@pytest.mark.parametrize("local", [False, True], ids=["split groups", "rank-local groups"])
@pytest.mark.parametrize(
    ("estimator", "options"),
    [
        ("grpo", {"scale_rewards": "batch", "std_correction": 1}),
        ("gpg", {}),
        ("grpo_passk", {}),
        ("grpo_passk", {"norm_adv_by_std_in_grpo": False}),
        ("gdpo", {"reward_weights": [1.0, 0.5]}),
    ],
)
def test_the_peer_estimators_across_ranks_equal_one_process(pool, estimator, options, local):
    """Batch statistics (the batch std, GPG's nonzero share, GDPO's whitening) over both ranks'
    trajectories; split groups also reduce their maxima and sums across the ranks."""
    rng = np.random.default_rng(11)
    sizes = [3, 1, 4, 2, 5, 2]
    index = np.repeat(np.arange(len(sizes)), sizes)
    rewards = rng.integers(0, 3, size=index.size) / 2  # ties and zeros
    rewards[index == 2] = 0.5  # a constant group
    components = np.stack([rewards, rng.integers(0, 2, size=index.size)], axis=1).astype(np.float64)
    one = GroupedRewards.from_flat(
        torch.tensor(rewards), torch.tensor(index), reward_components=torch.tensor(components)
    )
    want, _ = compute_advantages(one, estimator, **options)
    owner = index % 2 if local else np.arange(index.size) % 2
    specs = []
    for r in range(2):
        ids = index[owner == r]
        specs.append(
            dict(
                kind="flat",
                rewards=rewards[owner == r].tolist(),
                index=(np.unique(ids, return_inverse=True)[1] if local else ids).tolist(),
                components=components[owner == r].tolist(),
                num_groups=len(np.unique(ids)) if local else len(sizes),
                dtype="float64",
                local=local,
            )
        )
    for r, (got, dtype, _) in enumerate(pool.run_ok(rank_tasks.estimate, [(s, estimator, options) for s in specs])):
        assert dtype == "torch.float64"
        np.testing.assert_allclose(got, want.numpy()[owner == r], rtol=1e-9, atol=1e-9)
        if estimator != "gdpo":  # the constant group: exactly 0 on both ranks (gdpo whitens it)
            assert np.all(got[index[owner == r] == 2] == 0.0)


def test_gdpo_on_a_rank_without_trajectories_joins_the_whitening_without_components(pool):
    """Rank-local groups: the empty rank knows no ``R``, yet every rank makes the same collectives."""
    components = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
    index = [0, 0, 1, 1, 1]
    one = GroupedRewards.from_flat(
        torch.tensor(components[:, 0]), torch.tensor(index), reward_components=torch.tensor(components)
    )
    want, _ = compute_advantages(one, "gdpo")
    full = dict(kind="flat", rewards=components[:, 0].tolist(), index=index, components=components.tolist(),
                num_groups=2, dtype="float64", local=True)  # fmt: skip
    empty = dict(kind="flat", rewards=[], index=[], num_groups=0, dtype="float64", local=True)
    (got, _, _), (nothing, _, _) = pool.run_ok(rank_tasks.estimate, [(full, "gdpo", {}), (empty, "gdpo", {})])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    assert nothing.shape == (0,)


def test_ranks_that_disagree_on_the_number_of_reward_components_fail_on_every_rank(pool):
    specs = [
        dict(kind="flat", rewards=[1.0, 0.0], index=[0, 0], components=[[1.0, 0.0], [0.0, 1.0]], num_groups=1,
             dtype="float64", local=True),
        dict(kind="flat", rewards=[1.0, 0.0], index=[0, 0], components=[[1.0, 0, 1], [0.0, 1, 1]], num_groups=1,
             dtype="float64", local=True),
    ]  # fmt: skip
    errors = pool.run(rank_tasks.error_of, [(s, "gdpo", {}) for s in specs])
    assert all("reward components" in e for e in errors), errors
