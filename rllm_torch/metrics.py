"""Reward, advantage and group-difficulty metrics of one role, from packed tensors.

Every function returns a ``dict[str, float]`` of Python floats, built with one ``.tolist()``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.packing import GroupedRewards
from rllm_torch.segment import segment_var_mean

__all__ = ["summary_metrics", "difficulty_metrics", "ZERO_ADVANTAGE_ATOL", "DIFFICULTY_PERCENTILES"]

ZERO_ADVANTAGE_ATOL = 1e-8
"""An advantage with ``|a| < ZERO_ADVANTAGE_ATOL`` counts as zero in ``fraction_zero`` (rLLM's value)."""

DIFFICULTY_PERCENTILES = (10, 50, 90)
"""Percentiles of the group mean and std reported by :func:`difficulty_metrics`."""


def summary_metrics(values: Tensor, prefix: str, *, fraction_zero: bool = False) -> dict[str, float]:
    """``{prefix}/mean``, ``std`` (population, ddof 0, as ``np.std``), ``max``, ``min`` of a
    non-empty 1-D tensor, and with ``fraction_zero`` the share of ``|v| < 1e-8``.

    NaN values propagate into mean/std/max/min, as numpy's reductions do.
    """
    values = values.double()
    stats = [
        values.mean(),
        values.std(correction=0) if values.numel() > 1 else values.new_zeros(()),
        values.max(),
        values.min(),
    ]
    names = ["mean", "std", "max", "min"]
    if fraction_zero:
        stats.append((values.abs() < ZERO_ADVANTAGE_ATOL).double().mean())
        names.append("fraction_zero")
    return {f"{prefix}/{name}": value for name, value in zip(names, torch.stack(stats).tolist(), strict=True)}


def difficulty_metrics(batch: GroupedRewards, prefix: str) -> dict[str, float]:
    """How hard a role's tasks are, from its groups of two or more trajectories.

    A trajectory counts as solved when its reward is > 0. Keys (``{prefix}/...``):

    * ``num_groups``: groups of two or more trajectories (the only ones below);
    * ``fraction_nonzero_std``: share whose rewards are not all equal (they give GRPO a signal);
    * ``fraction_all_solved`` / ``fraction_all_failed``: share where every reward is > 0 / <= 0;
    * ``group_mean_p{10,50,90}``, ``group_std_p{10,50,90}``: percentiles (linear
      interpolation, ``torch.quantile``) of the group means and population stds; left out when
      there is no group of two or more.

    Args:
        batch: the role's packed rewards.
    """
    rewards_N = batch.rewards.double()
    counts_G = batch.counts
    var_G, mean_G = segment_var_mean(rewards_N, batch.group_index, batch.num_groups, correction=0)
    max_G = torch.full_like(mean_G, -torch.inf).scatter_reduce_(0, batch.group_index, rewards_N, "amax")
    min_G = torch.full_like(mean_G, torch.inf).scatter_reduce_(0, batch.group_index, rewards_N, "amin")
    multi_G = counts_G >= 2
    num_multi = int(multi_G.sum())
    out = {f"{prefix}/num_groups": float(num_multi)}
    if num_multi == 0:
        return out | {f"{prefix}/fraction_{k}": 0.0 for k in ("nonzero_std", "all_solved", "all_failed")}
    max_M, min_M = max_G[multi_G], min_G[multi_G]
    q = torch.tensor([p / 100 for p in DIFFICULTY_PERCENTILES], dtype=torch.float64)
    stats = torch.cat(
        [
            torch.stack([(max_M != min_M).double().mean(), (min_M > 0).double().mean(), (max_M <= 0).double().mean()]),
            torch.quantile(mean_G[multi_G], q),
            torch.quantile(var_G[multi_G].sqrt(), q),
        ]
    ).tolist()
    names = ["fraction_nonzero_std", "fraction_all_solved", "fraction_all_failed"]
    names += [f"group_mean_p{p}" for p in DIFFICULTY_PERCENTILES] + [f"group_std_p{p}" for p in DIFFICULTY_PERCENTILES]
    return out | {f"{prefix}/{name}": value for name, value in zip(names, stats, strict=True)}
