"""GDPO: several rewards per trajectory, each normalised within its group, summed with weights,
then whitened over the batch (TRL's ``multi_objective_aggregation="normalize_then_sum"``)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidRewardsError
from rllm_torch.core.estimators.scaling import (
    check_batch,
    check_correction,
    check_epsilon,
    divide_by_group_std,
    shared_docstring,
    standardise_over_batch,
)
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.segment import accumulation_dtype

__all__ = ["gdpo"]


def _check_weights(reward_weights: object, count: int) -> list[float]:
    if reward_weights is None:
        return [1.0] * count
    if isinstance(reward_weights, (str, bytes)) or not isinstance(reward_weights, Sequence):
        raise InvalidRewardsError(
            f"reward_weights must be a list of {count} numbers (one per reward function), got {reward_weights!r}."
        )
    if len(reward_weights) != count:
        raise InvalidRewardsError(
            f"reward_weights has {len(reward_weights)} value(s) but the batch has {count} reward functions; "
            f"give one weight per reward function (rllm.algorithm.estimator_options.gdpo.reward_weights=[...])."
        )
    for k, w in enumerate(reward_weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w):
            raise InvalidRewardsError(f"reward_weights[{k}] = {w!r}; every weight must be a finite number.")
    return [float(w) for w in reward_weights]


@shared_docstring
def gdpo(
    batch: GroupedRewards,
    *,
    reward_weights: Sequence[float] | None = None,
    epsilon: float = 1e-6,
    std_correction: int = 0,
) -> tuple[Tensor, Tensor]:
    """GDPO advantages from ``R >= 2`` rewards per trajectory (``batch.reward_components``):

    ``z_k = (r_k - mean_g(r_k)) / (std_g(r_k) + epsilon)`` for each reward function ``k`` within
    each group (GRPO of that reward), ``s = Σ_k w_k z_k``, then
    ``A = (s - mean_B(s)) / (std_B(s) + epsilon)`` over every trajectory of the batch (every
    rank's). One advantage per trajectory (per response), as TRL computes it: normalising each
    reward first keeps one reward's scale or spread from drowning the others, which summing first
    (then GRPO) would not.

    Args:
        {args_batch} It must carry ``reward_components [N, R]`` (``GroupedRewards.from_flat(
                rewards, group_index, reward_components=rewards_NR)``); the trainer fills them
                from each trajectory's ``reward_components``.
        reward_weights: ``R`` finite numbers ``w_k``, or ``None``: all 1 (TRL's ``reward_weights``).
        epsilon: added to both stds (TRL uses 1e-4).
        std_correction: 0 population std (rLLM), 1 sample std (TRL's ``nanstd``), for both stds.

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.
        InvalidRewardsError: the batch has no reward components, or only one (GDPO with one
            reward is GRPO followed by a batch whitening: use ``grpo``); ``reward_weights`` not one
            finite number per reward function; ``epsilon`` or ``std_correction`` invalid.

    Edge cases: in a group of one each ``z_k`` follows GRPO's rule (mean 0, std 1: ``r_k / (1 +
    epsilon)``); a reward constant within a group gives ``z_k = 0`` there exactly; a batch whose
    sums ``s`` are all equal gets exactly 0. A NaN reward makes the whole batch NaN (the
    whitening is batch-wide); TRL's "reward function returned None" rows have no equivalent here.
    The advantages are float64 for float64 components, float32 otherwise.
    {ranks}
    Collectives per call: ``R`` GRPO normalisations (split groups: 3 each; rank-local: none),
    then one ``all_gather`` of 4 values per rank for the batch whitening.

    References: Liu et al., "GDPO: Group reward-Decoupled Normalization Policy Optimization for
    Multi-reward RL Optimization", arXiv:2601.05242; TRL ``GRPOConfig.multi_objective_aggregation
    ="normalize_then_sum"``.

    Examples:
        >>> rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])  # the scalar reward, for the metrics
        >>> components = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
        >>> batch = GroupedRewards.from_flat(rewards, torch.tensor([0, 0, 1, 1]), reward_components=components)
        >>> gdpo(batch)[0]  # s = [1 - 1, -1 + 1, 0 + 1, 0 - 1] (up to epsilon): whitened
        tensor([ 0.0000,  0.0000,  1.4142, -1.4142])
    """
    check_batch(batch, "gdpo")
    epsilon, std_correction = check_epsilon(epsilon), check_correction(std_correction)
    components = batch.reward_components
    layout = batch.layout
    if components is None and batch.num_trajectories == 0 and (batch.process_group is None or batch.local_groups):
        # a rank without trajectories (rank-local groups) knows no R, and needs none: its groups'
        # normalisations are its own; it joins the batch whitening with nothing
        empty = batch.rewards.detach().to(accumulation_dtype(batch.rewards.dtype))
        adv = standardise_over_batch(empty, layout, epsilon, std_correction)
        return adv, adv
    if components is None or components.shape[-1] < 2:
        have = "no reward components" if components is None else "one reward function"
        raise InvalidRewardsError(
            f"gdpo normalises each of several rewards in its group before summing them, and this batch has {have}; "
            "with one reward it is GRPO followed by a batch whitening: use grpo (or reinforce_plus_plus_baseline). Give "
            "R >= 2 rewards per trajectory as GroupedRewards.from_flat(..., reward_components=rewards_NR) (in training: "
            "a task whose reward functions set Trajectory.reward_components)."
        )
    weights = _check_weights(reward_weights, components.shape[-1])
    values = components.detach().to(accumulation_dtype(components.dtype))
    total_N = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    for k, w in enumerate(weights):  # R GRPO normalisations (a loop over reward functions, not groups)
        stats = layout.center(layout.values(values[:, k].contiguous()))  # a group of one: mean 0, std 1
        total_N.add_(layout.flat(divide_by_group_std(stats, layout, epsilon, std_correction)), alpha=w)
    adv = standardise_over_batch(total_N, layout, epsilon, std_correction)
    return adv, adv
