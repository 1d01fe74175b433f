"""MaxRL advantages: the group-centred reward divided by the group's mean reward."""

from __future__ import annotations

from torch import Tensor

from rllm_torch.core.estimators.scaling import check_batch, shared_docstring, working_rewards
from rllm_torch.core.packing import GroupedRewards

__all__ = ["maxrl"]


@shared_docstring
def maxrl(batch: GroupedRewards) -> tuple[Tensor, Tensor]:
    """MaxRL advantages: ``A_i = (r_i - mean_g) / mean_g`` in a group whose mean reward is
    positive, and 0 in a group whose mean is 0 or negative.

    For success indicators (``r`` in {{0, 1}}) ``mean_g`` is the group's pass rate ``p``: a
    success gets ``(1 - p) / p``, a failure ``-1``, so rare successes weigh more as ``p`` falls
    (the gradient of ``log p``, the maximum-likelihood objective, rather than GRPO's ``p``).

    Args:
        {args_batch} Rewards are meant to be non-negative (success indicators); a group whose
            mean is not positive gets 0 (no success: nothing to learn from, prime-rl's rule), so
            a mean of 0 never divides.

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.

    Edge cases: a group of one gets 0 (its mean is its reward: ``(r - r) / r``); a group of
    equal positive rewards gets exactly 0; no epsilon is added (SkyRL divides by ``mean + 1e-6``,
    which gives about ``±1e6`` for rewards ``{{-1, +1}}``; here that group's mean is 0, so 0).
    {numerics}
    {ranks}
    Collectives per call: split groups 2 (``[G]`` max, ``[2G]`` sum); rank-local groups: none.

    References: "Maximum Likelihood Reinforcement Learning" (MaxRL); SkyRL
    ``advantage_estimator="maxrl"``, prime-rl ``algo.type="max_rl"``.

    Examples:
        >>> adv, _ = maxrl(GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0], [0.0, 0.0], [0.7]]))
        >>> adv
        tensor([ 3., -1., -1., -1.,  0.,  0.,  0.], dtype=torch.float64)
    """
    check_batch(batch, "maxrl")
    x, layout = working_rewards(batch)
    centred = layout.center(x, singleton_baseline=None)  # a group of one is centred on itself: 0
    mean = centred.mean
    positive = mean > 0
    scale = layout.expand(positive.to(x.dtype) / mean.where(positive, mean.new_ones(())))
    adv = layout.flat(centred.values * scale)
    return adv, adv
