"""REINFORCE Leave-One-Out (RLOO) advantages."""

from __future__ import annotations

from torch import Tensor

from rllm_torch.core.estimators.scaling import check_batch, shared_docstring, working_rewards
from rllm_torch.core.packing import GroupedRewards

__all__ = ["rloo"]


@shared_docstring
def rloo(batch: GroupedRewards) -> tuple[Tensor, Tensor]:
    """RLOO advantages: each reward minus the mean of the other rewards of its group.

    ``A_i = r_i - mean_{{j != i}} r_j = n / (n - 1) * (r_i - mean_g)`` for a group of ``n >= 2``.

    Args:
        {args_batch}

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.

    Edge cases: a group of one keeps its reward (``A = r``; rLLM's per-group helper returns a
    bare array there, we return the pair like every estimator); a group of two or more equal
    rewards gets exactly 0.
    {numerics}
    {ranks}
    Collectives per call: split groups 2 (``[G]`` max, ``[2G]`` sum); rank-local groups: none.

    References: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", arXiv:2402.14740; Kool et al., "Buy 4 REINFORCE
    Samples, Get a Baseline for Free!" (2019); rLLM ``calculate_rloo_advantages``.

    Examples:
        >>> adv, _ = rloo(GroupedRewards.from_groups([[1.0, 0.0, 0.0, 0.0], [0.7]]))
        >>> adv
        tensor([ 1.0000, -0.3333, -0.3333, -0.3333,  0.7000], dtype=torch.float64)
    """
    check_batch(batch, "rloo")
    x, layout = working_rewards(batch)
    adv = layout.center(x).values  # a group of one: baseline 0
    n = layout.counts  # the int K for equal groups on one process, else one count per group
    if isinstance(n, int):
        adv.mul_(n / (n - 1) if n > 1 else 1.0)
    else:
        n_G = n.to(x.dtype)
        adv.mul_(layout.expand(layout.where_singleton(n_G / (n_G - 1), 1.0)))
    adv = layout.flat(adv)
    return adv, adv
