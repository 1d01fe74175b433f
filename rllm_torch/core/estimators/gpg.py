"""Group Policy Gradient (GPG): the group-mean baseline, scaled up by the share of the batch that
carries a reward."""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.estimators.scaling import check_batch, shared_docstring, working_rewards
from rllm_torch.core.packing import GroupedRewards

__all__ = ["gpg"]


@shared_docstring
def gpg(batch: GroupedRewards) -> tuple[Tensor, Tensor]:
    """GPG advantages: ``A_i = alpha * (r_i - mean_g)`` with ``alpha = B / max(M, 1)``, ``B`` the
    number of trajectories of the batch and ``M`` how many of them have a nonzero reward (both
    over every rank).

    With binary rewards ``M`` counts the correct trajectories, so a batch where few are correct
    gets larger advantages (verl's form of GPG's batch-level correction); no std division. Pair it with ``loss_fn=cross_entropy``
    (``-A log π``, verl's ``loss_mode=gpg``) for GPG's plain policy gradient.

    Args:
        {args_batch}

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.

    Edge cases: a group of one has baseline 0 (``A = alpha * r``), as verl; a batch with no
    nonzero reward has ``alpha = B`` and only zero advantages; a constant group gets exactly 0;
    a NaN reward counts as nonzero and makes its own group NaN.
    {numerics}
    {ranks}
    Collectives per call: 1 (``B`` and ``M``, a ``[2]`` sum); split groups 2 more (the group mean).

    References: Chu et al., "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
    Reasoning", arXiv:2504.02546; ``alpha`` as verl's ``compute_gpg_outcome_advantage`` computes
    it (``bsz / count_nonzero(scores)``, ``f_norm = 1``).

    Examples:
        >>> adv, _ = gpg(GroupedRewards.from_groups([[1, 0, 0, 0], [0, 0]]))
        >>> adv  # 1 of 6 rewards nonzero: alpha = 6; group 0's mean 0.25
        tensor([ 4.5000, -1.5000, -1.5000, -1.5000,  0.0000,  0.0000])
    """
    check_batch(batch, "gpg")
    x, layout = working_rewards(batch)
    x_N = layout.flat(x)
    counts = torch.stack([torch.ones_like(x_N, dtype=torch.float64), (x_N != 0).to(torch.float64)])
    total, nonzero = layout.batch_total(counts)  # float64: exact counts at any batch size
    alpha = (total / nonzero.clamp(min=1.0)).to(x.dtype)
    adv = layout.flat(layout.center(x).values.mul_(alpha))  # a group of one: baseline 0
    return adv, adv
