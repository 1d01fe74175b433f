"""Group Relative Policy Optimization (GRPO) advantages, and Dr. GRPO's unnormalised variant."""

from __future__ import annotations

from torch import Tensor

from rllm_torch.core.errors import InvalidRewardsError
from rllm_torch.core.estimators.scaling import (
    check_batch,
    check_correction,
    check_epsilon,
    check_flag,
    divide_by_group_std,
    shared_docstring,
    working_rewards,
)
from rllm_torch.core.moments import std_plus_epsilon
from rllm_torch.core.packing import GroupedRewards

__all__ = ["grpo"]


@shared_docstring
def grpo(
    batch: GroupedRewards,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    std_correction: int = 0,
    scale_rewards: str = "group",
) -> tuple[Tensor, Tensor]:
    """GRPO advantages: each reward standardised within its group.

    ``A_i = (r_i - mean_g) / (std_g + epsilon)``, with ``std_g`` the group's standard deviation
    with ``std_correction`` (0 = population std, as rLLM; 1 = sample std, as verl) and
    ``epsilon`` added outside the square root. With ``norm_adv_by_std_in_grpo=False``:
    ``A_i = r_i - mean_g`` (Dr. GRPO). With ``scale_rewards="batch"`` (TRL's option):
    ``A_i = (r_i - mean_g) / (std_B + epsilon)``, ``std_B`` the std of every reward of the batch
    (every rank's), so groups keep their relative spread (TRL's ``"none"`` is
    ``norm_adv_by_std_in_grpo=False``).

    Args:
        {args_batch}
        norm_adv_by_std_in_grpo: divide by a std (GRPO) or not (Dr. GRPO).
        epsilon: added to the std in the denominator.
        std_correction: Bessel correction of the std, as ``correction`` in :func:`torch.std`.
        scale_rewards: ``"group"`` (each group's std) or ``"batch"`` (the batch's std of the rewards).

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards, or an option has the wrong type.
        InvalidRewardsError: ``epsilon`` is negative, ``std_correction`` is not a non-negative int,
            ``scale_rewards`` is neither ``"group"`` nor ``"batch"``, or ``"batch"`` with
            ``norm_adv_by_std_in_grpo=False`` (which asks for no scale at all).

    Edge cases: a group of one has mean 0 and std 1 (as rLLM), so its advantage is
    ``r / (1 + epsilon)`` (with ``"batch"``: ``r / (std_B + epsilon)``); a group of two or more
    equal rewards gets exactly 0. With ``"batch"`` a NaN reward makes the whole batch NaN.
    {numerics}
    {ranks}
    Collectives per call: split groups 3 (``[G]`` max, ``[2G]`` and ``[G]`` sums; 2 with
    ``norm_adv_by_std_in_grpo=False``); rank-local groups: none. ``"batch"``: the group mean's,
    then one ``all_gather`` of 4 values per rank for the batch std.

    References: Shao et al., "DeepSeekMath", arXiv:2402.03300 (GRPO); Liu et al., "Understanding
    R1-Zero-Like Training: A Critical Perspective", arXiv:2503.20783 (Dr. GRPO); rLLM
    ``calculate_grpo_advantages_per_group``; TRL ``GRPOConfig.scale_rewards="batch"`` (the
    batch std, as Lite PPO recommends: "Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
    arXiv:2508.08221).

    Examples:
        >>> adv, _ = grpo(GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0], [0.5]]))
        >>> adv
        tensor([ 1.7320, -0.5773, -0.5773, -0.5773,  0.5000], dtype=torch.float64)
    """
    check_batch(batch, "grpo")
    check_flag(norm_adv_by_std_in_grpo, "norm_adv_by_std_in_grpo")
    epsilon, std_correction = check_epsilon(epsilon), check_correction(std_correction)
    if scale_rewards not in ("group", "batch"):
        raise InvalidRewardsError(
            f"scale_rewards must be 'group' (each group's std) or 'batch' (the batch's std), got {scale_rewards!r}; "
            "TRL's 'none' is norm_adv_by_std_in_grpo=False."
        )
    if scale_rewards == "batch" and not norm_adv_by_std_in_grpo:
        raise InvalidRewardsError(
            "scale_rewards='batch' divides by the batch std, and norm_adv_by_std_in_grpo=False by no std: set only one."
        )
    x, layout = working_rewards(batch)
    stats = layout.center(x)  # a group of one: mean 0
    adv = stats.values
    if norm_adv_by_std_in_grpo and scale_rewards == "batch":
        adv = layout.flat(adv).div_(std_plus_epsilon(layout.batch_std(layout.flat(x), std_correction), epsilon))
        return adv, adv
    if norm_adv_by_std_in_grpo:
        adv = divide_by_group_std(stats, layout, epsilon, std_correction)  # a group of one: std 1
    adv = layout.flat(adv)
    return adv, adv
