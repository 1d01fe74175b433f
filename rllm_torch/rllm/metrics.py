"""Reward, advantage and group-difficulty metrics of one role, from packed tensors.

Every function returns a ``dict[str, float]`` of Python floats, built with one ``.tolist()``.
Under a process group (``process_group=`` / a batch built with one) the metrics are those of
the global batch, identical on every rank: each rank's moments (count, mean, centred sum of
squares, max, min) are gathered with one ``all_gather_object`` and merged exactly
(:func:`~rllm_torch.core.moments.chan_merge`), and group statistics are gathered per group
(``O(G)`` payload).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from rllm_torch.core.distributed import world_position
from rllm_torch.core.moments import chan_merge
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.segment import segment_var_mean

__all__ = ["summary_metrics", "difficulty_metrics", "ZERO_ADVANTAGE_ATOL", "DIFFICULTY_PERCENTILES"]

ZERO_ADVANTAGE_ATOL = 1e-8
"""An advantage with ``|a| < ZERO_ADVANTAGE_ATOL`` counts as zero in ``fraction_zero`` (rLLM's value)."""

DIFFICULTY_PERCENTILES = (10, 50, 90)
"""Percentiles of the group mean and std reported by :func:`difficulty_metrics`."""


def _moments(values: Tensor, fraction_zero: bool) -> list[float]:
    """``[n, mean, M2, max, min, zeros]`` of a 1-D float64 tensor (``n = 0``: only the count)."""
    if values.numel() == 0:
        return [0.0, 0.0, 0.0, -float("inf"), float("inf"), 0.0]
    mean = values.mean()
    stats = [mean, ((values - mean) ** 2).sum(), values.max(), values.min()]
    stats.append((values.abs() < ZERO_ADVANTAGE_ATOL).sum().double() if fraction_zero else mean.new_zeros(()))
    return [float(values.numel()), *torch.stack(stats).tolist()]


def summary_metrics(
    values: Tensor, prefix: str, *, fraction_zero: bool = False, process_group: dist.ProcessGroup | None = None
) -> dict[str, float]:
    """``{prefix}/mean``, ``std`` (population, ddof 0, as ``np.std``), ``max``, ``min`` of a 1-D
    tensor, and with ``fraction_zero`` the share of ``|v| < 1e-8``.

    NaN values propagate into mean/std/max/min, as numpy's reductions do. With a
    ``process_group`` (every rank must call), over the values of every rank; ``{}`` when there is
    no value at all (on one process, ``values`` must not be empty).
    """
    values = values.double()
    if process_group is None:
        stats = [
            values.mean(),
            values.std(correction=0) if values.numel() > 1 else values.new_zeros(()),
            values.max(),
            values.min(),
        ]
        if fraction_zero:
            stats.append((values.abs() < ZERO_ADVANTAGE_ATOL).double().mean())
        stats = torch.stack(stats).tolist()
    else:
        _, world = world_position(process_group)
        parts: list = [None] * world
        dist.all_gather_object(parts, _moments(values, fraction_zero), group=process_group)
        parts = [p for p in parts if p[0] > 0] or parts  # a rank without values takes no part
        n_W, mean_W, m2_W, high_W, low_W, zeros_W = torch.tensor(parts, dtype=torch.float64).unbind(1)
        n, shift, mean_shifted, m2 = chan_merge(n_W, mean_W, torch.zeros_like(mean_W), m2_W)
        if n == 0:
            return {}
        mean = shift + mean_shifted
        high, low = (mean, mean) if mean.isnan() else (high_W.max(), low_W.min())  # NaN: NaN everywhere
        stats = [mean, (m2 / n).sqrt(), high, low] + ([zeros_W.sum() / n] if fraction_zero else [])
        stats = torch.stack(stats).tolist()
    names = ["mean", "std", "max", "min"] + (["fraction_zero"] if fraction_zero else [])
    return {f"{prefix}/{name}": value for name, value in zip(names, stats, strict=True)}


def difficulty_metrics(batch: GroupedRewards, role: str) -> dict[str, float]:
    """How hard a role's tasks are, from its groups of two or more trajectories (rLLM's
    per-group difficulty diagnostics, under rLLM's keys ``batch/{role}/...``):

    * ``total``: groups of two or more trajectories (the only ones below); ``informative``:
      those whose rewards have a population std ``>= 1e-8`` (they give GRPO a signal);
    * ``fractions/effective``: ``informative / total``; ``fractions/too_easy`` / ``too_hard``:
      share of groups with std ``< 1e-8`` and mean ``>= 1`` / mean ``<= 0`` (all solved / all
      failed, for rewards in ``[0, 1]``);
    * ``group_reward_mean/p{10,50,90}``, ``group_reward_std/p{10,50,90}``: percentiles (linear
      interpolation, as ``np.percentile``) of the group means and population stds.

    No key at all when the role has no group of two or more (as rLLM).

    Args:
        batch: the role's packed rewards; under a process group, with rank-local groups (as the
            collector packs them): every rank must call, and the groups of every rank count.
        role: the group role, in the keys.

    Raises:
        NotImplementedError: ``batch`` has groups split over ranks.

    Source: rLLM ``collect_reward_and_advantage_from_trajectory_groups`` (``batch/{role}/*``).
    """
    rewards_N = batch.rewards.double()
    var_G, mean_G = segment_var_mean(rewards_N, batch.group_index, batch.num_groups, correction=0)
    stats_G3 = torch.stack([batch.counts.double(), mean_G, var_G], dim=1).cpu()
    if batch.process_group is not None:
        if not batch.local_groups:
            raise NotImplementedError("difficulty_metrics needs rank-local groups (local_groups=True).")
        _, world = world_position(batch.process_group)
        parts: list = [None] * world
        dist.all_gather_object(parts, stats_G3, group=batch.process_group)
        stats_G3 = torch.cat(parts)
    counts_G, mean_G, var_G = stats_G3.unbind(1)
    multi_G = counts_G >= 2
    total = int(multi_G.sum())
    if total == 0:
        return {}
    mean_M, std_M = mean_G[multi_G], var_G[multi_G].sqrt()
    flat_M = std_M < ZERO_ADVANTAGE_ATOL
    informative = int((~flat_M).sum())
    q = torch.tensor([p / 100 for p in DIFFICULTY_PERCENTILES], dtype=torch.float64)
    stats = torch.cat(
        [
            torch.stack([(flat_M & (mean_M >= 1.0)).double().sum(), (flat_M & (mean_M <= 0.0)).double().sum()]) / total,
            torch.quantile(mean_M, q),
            torch.quantile(std_M, q),
        ]
    ).tolist()
    prefix = f"batch/{role}"
    out = {
        f"{prefix}/total": float(total),
        f"{prefix}/informative": float(informative),
        f"{prefix}/fractions/effective": informative / total,
        f"{prefix}/fractions/too_easy": stats[0],
        f"{prefix}/fractions/too_hard": stats[1],
    }
    for i, p in enumerate(DIFFICULTY_PERCENTILES):
        out[f"{prefix}/group_reward_mean/p{p}"] = stats[2 + i]
        out[f"{prefix}/group_reward_std/p{p}"] = stats[2 + len(DIFFICULTY_PERCENTILES) + i]
    return out
