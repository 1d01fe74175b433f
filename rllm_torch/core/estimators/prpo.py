"""PRPO: rewards whitened over the whole batch (role), with no group baseline."""

from __future__ import annotations

from torch import Tensor

from rllm_torch.core.estimators.scaling import (
    check_batch,
    check_epsilon,
    shared_docstring,
    standardise_over_batch,
    working_rewards,
)
from rllm_torch.core.packing import GroupedRewards

__all__ = ["prpo"]


@shared_docstring
def prpo(batch: GroupedRewards, *, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
    """PRPO advantages: ``A_i = (r_i - m) / (s + epsilon)``, ``m`` and ``s`` the mean and
    population std of all rewards of the batch; groups play no part.

    Args:
        {args_batch} Pass one role's groups per call: the statistics are batch-wide.
        epsilon: added to the batch std in the denominator.

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.
        InvalidRewardsError: ``epsilon`` is negative.

    Edge cases: a batch whose rewards are all equal gets exactly 0; one NaN reward makes the
    whole batch NaN.
    {numerics}
    {ranks}
    Collectives per call: 1 (an ``all_gather`` of 4 values per rank) for either layout.

    References: rLLM's ``rLLMAdvantageEstimator.PRPO`` (batch-level reward whitening, as in
    REINFORCE++'s global normalisation, arXiv:2501.03262), with the semantics of docs/design.md §3.

    Examples:
        >>> adv, _ = prpo(GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0]]))
        >>> [round(a, 6) for a in adv.tolist()]  # mean 0.5, std 0.5: +-0.5 / (0.5 + 1e-6)
        [0.999998, -0.999998, -0.999998, -0.999998, 0.999998, 0.999998]
    """
    check_batch(batch, "prpo")
    epsilon = check_epsilon(epsilon)
    x, layout = working_rewards(batch)
    adv = standardise_over_batch(layout.flat(x), layout, epsilon)
    return adv, adv
