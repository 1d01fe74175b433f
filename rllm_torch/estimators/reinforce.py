"""REINFORCE (no baseline) and REINFORCE++ with a group-mean baseline."""

from __future__ import annotations

from torch import Tensor

from rllm_torch.estimators._common import check_batch, check_epsilon, shared_docstring, whiten, working_rewards
from rllm_torch.packing import GroupedRewards

__all__ = ["reinforce", "reinforce_plus_plus_baseline"]


@shared_docstring
def reinforce(batch: GroupedRewards) -> tuple[Tensor, Tensor]:
    """REINFORCE advantages: the reward itself, ``A_i = r_i`` (no baseline).

    Args:
        {args_batch}

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.

    {numerics}
    {ranks}
    Collectives per call: none (no statistic).

    References: Williams, "Simple statistical gradient-following algorithms for connectionist
    reinforcement learning", Machine Learning 8 (1992); rLLM ``calculate_reinforce_advantages``.

    Example:
        >>> adv, _ = reinforce(GroupedRewards.from_groups([[True, False], [3]]))
        >>> adv
        tensor([1., 0., 3.])
    """
    check_batch(batch, "reinforce")
    x, layout = working_rewards(batch)
    adv = layout.flat(x).clone()
    return adv, adv


@shared_docstring
def reinforce_plus_plus_baseline(batch: GroupedRewards, *, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group-mean baseline, whitened over the whole batch (role).

    ``c_i = r_i - mean_g`` for a group of two or more, ``c_i = r_i`` for a group of one
    (baseline 0), then ``A_i = c_i / (std_B + epsilon)`` with ``std_B`` the population std of all
    ``c`` of the batch (centred on their mean).

    Args:
        {args_batch} Pass one role's groups per call: the whitening is batch-wide.
        epsilon: added to the batch std in the denominator.

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.
        InvalidRewardsError: ``epsilon`` is negative.

    Edge cases: a group of one keeps baseline 0 as rLLM's docstring says (rLLM's code subtracts
    the singleton's own reward and gets 0; we follow the docstring on purpose, so one rollout
    per task still learns); a group of two or more equal rewards gets exactly 0. A NaN reward
    makes the whole batch NaN, since ``std_B`` is batch-wide.
    {numerics}
    {ranks}
    Collectives per call: split groups 3 (the group mean: ``[G]`` max and ``[2G]`` sum; the
    batch std: an ``all_gather`` of 3 values per rank); rank-local groups: the batch std's 1.

    References: Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models", arXiv:2501.03262; rLLM ``calculate_reinforce_plus_plus_baseline_advantages``.

    Example:
        >>> adv, _ = reinforce_plus_plus_baseline(GroupedRewards.from_groups([[1.0, 0.0], [1.0]]))
        >>> adv  # c = [0.5, -0.5, 1.0], std(c) = sqrt(42/108)
        tensor([ 0.8018, -0.8018,  1.6036], dtype=torch.float64)
    """
    check_batch(batch, "reinforce_plus_plus_baseline")
    epsilon = check_epsilon(epsilon)
    x, layout = working_rewards(batch)
    centered = layout.center(x).values  # a group of one: baseline 0
    adv = whiten(layout.flat(centered), layout, epsilon)
    return adv, adv
