"""On-Policy RL with Optimal reward baseline (OPO): a length-weighted group-mean baseline."""

from __future__ import annotations

from torch import Tensor

from rllm_torch.core.errors import InvalidRewardsError
from rllm_torch.core.estimators.scaling import check_batch, shared_docstring, working_rewards
from rllm_torch.core.packing import GroupedRewards

__all__ = ["opo"]


@shared_docstring
def opo(batch: GroupedRewards) -> tuple[Tensor, Tensor]:
    """OPO advantages: each reward minus its group's length-weighted mean reward.

    ``b_g = sum_i l_i r_i / sum_i l_i`` over the group's trajectories, with ``l_i`` the weight
    of trajectory ``i`` (``batch.weights``: its response token count), and ``A_i = r_i - b_g``.
    With equal lengths it is Dr. GRPO's ``r_i - mean_g``.

    Args:
        {args_batch} It must carry weights: ``GroupedRewards.from_flat(rewards, group_index,
                weights=lengths)`` (or ``weights=`` on any constructor). The trainer fills them
                with each trajectory's trained token count (every step's response mask).

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.
        InvalidRewardsError: ``batch`` has no weights.

    Edge cases: a group of one has baseline 0 (``A = r``, as GRPO's singleton rule here); a
    group of equal rewards gets exactly 0 whatever its lengths; a group whose weights sum to 0
    falls back to the unweighted mean (the limit of equal lengths). The baseline is the float64
    sum ``sum_i l_i (r_i - s) / sum_i l_i`` around a reward ``s`` of the group (its first,
    or its maximum when split over ranks), so large offsets lose no precision.
    {numerics}
    {ranks}
    Collectives per call: split groups 2 (``[G]`` max, then one ``[4G]`` sum: weighted and plain
    sums, weights and counts); rank-local groups: none.

    References: Hao et al., "On-Policy RL with Optimal Reward Baseline", arXiv:2505.23585 (eq. 6,
    the length-weighted baseline that minimises the gradient variance when every token's
    gradient has the same norm).

    Examples:
        >>> rewards = GroupedRewards.from_groups([[1.0, 0.0]], weights=[[3, 1]])
        >>> opo(rewards)[0]  # b = (3 * 1 + 1 * 0) / 4
        tensor([ 0.2500, -0.7500], dtype=torch.float64)
    """
    check_batch(batch, "opo")
    if batch.weights is None:
        raise InvalidRewardsError(
            "opo needs each trajectory's response length as a weight: build the batch with "
            "GroupedRewards.from_flat(rewards, group_index, weights=lengths) (or weights= on from_groups / from_padded)."
        )
    x, layout = working_rewards(batch)
    baseline_G = layout.where_singleton(layout.weighted_mean(x, layout.values(batch.weights)), 0.0)
    adv = layout.flat(x - layout.expand(baseline_G))  # a group of one: baseline 0
    return adv, adv
