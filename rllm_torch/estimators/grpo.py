"""Group Relative Policy Optimization (GRPO) advantages, and Dr. GRPO's unnormalised variant."""

from __future__ import annotations

from torch import Tensor

from rllm_torch.estimators._common import (
    check_batch,
    check_correction,
    check_epsilon,
    check_flag,
    shared_docstring,
    std_plus_epsilon,
    working_rewards,
)
from rllm_torch.packing import GroupedRewards

__all__ = ["grpo"]


@shared_docstring
def grpo(
    batch: GroupedRewards,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    std_correction: int = 0,
) -> tuple[Tensor, Tensor]:
    """GRPO advantages: each reward standardised within its group.

    ``A_i = (r_i - mean_g) / (std_g + epsilon)``, with ``std_g`` the group's standard deviation
    with ``std_correction`` (0 = population std, as rLLM; 1 = sample std, as verl) and
    ``epsilon`` added outside the square root. With ``norm_adv_by_std_in_grpo=False``:
    ``A_i = r_i - mean_g`` (Dr. GRPO).

    Args:
        {args_batch}
        norm_adv_by_std_in_grpo: divide by the group std (GRPO) or not (Dr. GRPO).
        epsilon: added to the std in the denominator.
        std_correction: Bessel correction of the std, as ``correction`` in :func:`torch.std`.

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards, or an option has the wrong type.
        InvalidRewardsError: ``epsilon`` is negative or ``std_correction`` is not a non-negative int.

    Edge cases: a group of one has mean 0 and std 1 (as rLLM), so its advantage is
    ``r / (1 + epsilon)``; a group of two or more equal rewards gets exactly 0.
    {numerics}
    {ranks}
    Collectives per call: split groups 3 (``[G]`` max, ``[2G]`` and ``[G]`` sums; 2 with
    ``norm_adv_by_std_in_grpo=False``); rank-local groups: none.

    References: Shao et al., "DeepSeekMath", arXiv:2402.03300 (GRPO); Liu et al., "Understanding
    R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783 (Dr. GRPO); rLLM
    ``calculate_grpo_advantages_per_group``.

    Example:
        >>> adv, _ = grpo(GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0], [0.5]]))
        >>> adv
        tensor([ 1.7320, -0.5773, -0.5773, -0.5773,  0.5000], dtype=torch.float64)
    """
    check_batch(batch, "grpo")
    check_flag(norm_adv_by_std_in_grpo, "norm_adv_by_std_in_grpo")
    epsilon, std_correction = check_epsilon(epsilon), check_correction(std_correction)
    x, layout = working_rewards(batch)
    stats = layout.center(x)  # a group of one: mean 0
    adv = stats.values
    if norm_adv_by_std_in_grpo:
        std_G = layout.where_singleton(stats.var(std_correction).sqrt_(), 1.0)  # a group of one: std 1
        adv.mul_(layout.expand(std_plus_epsilon(std_G, epsilon).reciprocal_()))  # one division per group
    adv = layout.flat(adv)
    return adv, adv
