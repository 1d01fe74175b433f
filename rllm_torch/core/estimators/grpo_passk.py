"""verl's ``grpo_passk``: only each group's best trajectory is credited, with its margin over the
second best (a pass@k-style outcome advantage)."""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.estimators.scaling import (
    check_batch,
    check_correction,
    check_epsilon,
    check_flag,
    shared_docstring,
    working_rewards,
)
from rllm_torch.core.moments import std_plus_epsilon
from rllm_torch.core.packing import GroupedRewards

__all__ = ["grpo_passk"]


@shared_docstring
def grpo_passk(
    batch: GroupedRewards,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    std_correction: int = 0,
) -> tuple[Tensor, Tensor]:
    """Best-versus-second advantages: ``A_i = r_max - r_2nd`` for the trajectory with the group's
    largest reward, ``A_i = 0`` for the others (divided by ``std_g + epsilon`` with
    ``norm_adv_by_std_in_grpo``, ``std_g`` the group's std with ``std_correction``).

    ``r_2nd`` is the second largest reward counting ties, so a group whose maximum is shared
    gets exactly 0 everywhere (no member is better than all the others), whichever of the tied
    members one would call the best. Maximising the best sample's margin trains for pass@k-style
    objectives: only a group's best attempt matters.

    Args:
        {args_batch}
        norm_adv_by_std_in_grpo: divide by the group's std (verl's default) or not.
        epsilon: added to the std.
        std_correction: 0 population std (rLLM), 1 sample std (verl's ``torch.std``).

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards, or an option has the wrong type.
        InvalidRewardsError: ``epsilon`` is negative or ``std_correction`` is not a non-negative int.

    Edge cases: a group of one has baseline 0 and std 1, as GRPO's rule here: ``A = r / (1 +
    epsilon)`` (``r`` without the std); verl raises for a group of one. A group with a NaN reward
    is NaN throughout; a constant group is exactly 0.
    {numerics}
    {ranks}
    Collectives per call: split groups 3 (the maximum, the count at the maximum, the second
    maximum) and the std's 3 with ``norm_adv_by_std_in_grpo``; rank-local groups: none.

    References: verl ``compute_grpo_passk_outcome_advantage`` (``AdvantageEstimator.GRPO_PASSK``),
    after Tang et al., "Optimizing Language Models for Inference Time Objectives using
    Reinforcement Learning", arXiv:2503.19595.

    Examples:
        >>> adv, _ = grpo_passk(GroupedRewards.from_groups([[0.2, 0.9, 0.5], [1.0, 1.0]]),
        ...                     norm_adv_by_std_in_grpo=False)
        >>> adv  # group 0: 0.9 - 0.5 on its best member; group 1: a tie, no margin
        tensor([0.0000, 0.4000, 0.0000, 0.0000, 0.0000], dtype=torch.float64)
    """
    check_batch(batch, "grpo_passk")
    check_flag(norm_adv_by_std_in_grpo, "norm_adv_by_std_in_grpo")
    epsilon, std_correction = check_epsilon(epsilon), check_correction(std_correction)
    x, layout = working_rewards(batch)
    best_G = layout.max(x)
    at_best = x == layout.expand(best_G)
    ties_G = layout.sum(at_best.to(x.dtype) + 0.0 * x)  # members at the maximum; NaN if a reward is NaN
    second_G = torch.where(ties_G >= 2, best_G, layout.max(torch.where(at_best, -torch.inf, x)))
    margin_G = best_G - layout.where_singleton(second_G, 0.0)  # a group of one: baseline 0
    if norm_adv_by_std_in_grpo:
        std_G = layout.center(x, singleton_baseline=None).var(std_correction).sqrt_()
        margin_G = margin_G / std_plus_epsilon(layout.where_singleton(std_G, 1.0), epsilon)
    margin_G = torch.where(ties_G.isnan(), torch.nan, margin_G)
    adv = torch.where(at_best, layout.expand(margin_G), 0.0)
    adv = layout.flat(torch.where(layout.expand(ties_G).isnan(), torch.nan, adv))
    return adv, adv
