"""ReMax advantages: the reward minus the reward of a greedy rollout of the same prompt."""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidRewardsError
from rllm_torch.core.estimators.scaling import check_batch, shared_docstring, working_rewards
from rllm_torch.core.packing import GroupedRewards

__all__ = ["remax"]


@shared_docstring
def remax(batch: GroupedRewards, *, baselines: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """ReMax advantages: ``A_i = r_i - b_g``, with ``b_g`` the reward of a greedy (argmax)
    rollout of group ``g``'s prompt, sampled by the same policy and scored by the same reward.

    The baseline depends on the prompt and the policy only, not on the sampled response, so the
    gradient stays unbiased; the greedy rollout is not trained on.

    Args:
        {args_batch}
        baselines: ``[G]`` float, each group's greedy reward, on the batch's device (the
            trainer samples them when a role's estimator is ``remax``). Across ranks, each rank
            gives the baselines of the groups it indexes (they are per group, so no collective).

    Returns:
        ``(advantages, returns)``: ``[N]`` in the batch's flat order, float64 for float64
        rewards and float32 otherwise (the baselines are cast to it); the returns are the rewards (verl's ReMax
        returns), the advantages the rewards minus their group's baseline. New, detached tensors.

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.
        InvalidRewardsError: ``baselines`` missing, or not a ``[G]`` floating-point tensor on the
            batch's device.

    Edge cases: a group whose rewards all equal its baseline gets exactly 0; a group of equal
    rewards above (below) its baseline gets a positive (negative) advantage, unlike the
    group-mean estimators; a group of one is its reward minus its baseline. A NaN baseline
    makes NaN only in its own group. No host-device synchronisation, no collective.

    References: Li et al., "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Aligning Large Language Models", arXiv:2310.10505; verl ``adv_estimator=remax``
    (``compute_remax_outcome_advantage``).

    Examples:
        >>> batch = GroupedRewards.from_groups([[1.0, 0.0, 1.0], [0.0, 0.0]])
        >>> adv, ret = remax(batch, baselines=torch.tensor([1.0, 0.0]))
        >>> adv
        tensor([ 0., -1.,  0.,  0.,  0.], dtype=torch.float64)
    """
    check_batch(batch, "remax")
    if baselines is None:
        raise InvalidRewardsError(
            "remax needs baselines=, each group's greedy reward ([G] float); the trainer samples them when a role's "
            "estimator is remax (rllm.algorithm.adv_estimator=remax)."
        )
    if (
        not isinstance(baselines, Tensor)
        or not baselines.is_floating_point()
        or tuple(baselines.shape) != (batch.num_groups,)
        or baselines.device != batch.device
    ):
        raise InvalidRewardsError(
            f"remax needs baselines, a [G] = [{batch.num_groups}] floating-point tensor on {batch.device}: each "
            f"group's greedy reward; got {getattr(baselines, 'dtype', type(baselines).__name__)} "
            f"{tuple(getattr(baselines, 'shape', ()))} on {getattr(baselines, 'device', None)}."
        )
    x, layout = working_rewards(batch)
    rewards_N = layout.flat(x)
    returns_N = rewards_N.clone()
    adv_N = returns_N - torch.index_select(baselines.detach().to(returns_N.dtype), 0, batch.group_index)
    return adv_N, returns_N
