"""Pass@k Policy Optimization (PKPO): binary rewards transformed so that the policy gradient
optimises pass@k, with a group-mean baseline."""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from rllm_torch.core.distributed import agree_across_ranks
from rllm_torch.core.errors import InvalidRewardsError, RLLMTorchError
from rllm_torch.core.estimators.scaling import check_batch, shared_docstring, working_rewards
from rllm_torch.core.packing import GroupedRewards
from rllm_torch.core.segment import SegmentLayout

__all__ = ["pass_at_k", "pass_at_k_rewards"]


def _check_k(k: object) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise InvalidRewardsError(
            f"pass_at_k needs an int option k >= 1 (the number of attempts whose best counts), got {k!r}; "
            "e.g. compute_advantages(batch, 'pass_at_k', k=2), or rllm.algorithm.estimator_options.pass_at_k.k=2."
        )
    return int(k)


def _check_input(x: Tensor, layout: SegmentLayout, k: int, counts: Tensor | int) -> None:
    """Binary rewards and ``k <= n`` in every non-empty group (one host sync), else an error
    naming the first offending trajectory or group."""
    binary_N = (x == 0) | (x == 1)
    if isinstance(counts, int):
        too_small = x.new_tensor(0 < counts < k, dtype=torch.bool)
    else:
        too_small = ((counts > 0) & (counts < k)).any()
    all_binary, too_small = torch.stack([binary_N.all(), too_small]).tolist()
    if not all_binary:
        pos = int((~binary_N.reshape(-1)).nonzero()[0, 0])
        raise InvalidRewardsError(
            f"pass_at_k needs binary rewards (0/1 or bool: pass@k counts correct attempts), but trajectory {pos} in flat "
            f"order has reward {x.reshape(-1)[pos].item()!r}; map rewards to correctness first (e.g. reward > 0), or use "
            "an estimator for real-valued rewards (grpo, rloo)."
        )
    if too_small:
        sizes = torch.as_tensor(counts).reshape(-1)
        g = int(((sizes > 0) & (sizes < k)).nonzero()[0, 0])
        raise InvalidRewardsError(
            f"pass_at_k with k={k}: group {g} has {int(sizes[g])} trajectory(ies); k must be at most every group's size "
            f"(rllm.rollout.n rollouts per prompt, fewer if some are filtered out): lower k or sample more."
        )


def pass_at_k_rewards(batch: GroupedRewards, *, k: int | None = None) -> Tensor:
    """PKPO's transformed rewards ``r~ [N]`` for binary rewards, before the baseline.

    For a group of ``n`` trajectories with ``c`` correct: ``r~_i = 1`` for a correct one and
    ``r~_i = 1 - C(n - c - 1, k - 1) / C(n - 1, k - 1)`` for an incorrect one: the mean, over
    the ``k``-subsets that contain ``i``, of the subset's pass (whether any member is correct).
    The binomial ratio is ``exp`` of ``lgamma`` sums in float64 (no subset is enumerated;
    stable for any ``n``). The unbiased estimator of the pass@k gradient weighs each
    trajectory's score function by ``(k / n) r~_i`` (PKPO, Theorem 3.2).

    Args:
        batch: binary rewards (bool, or 0/1 numbers), any device.
        k: ``1 <= k <= n`` for every non-empty group (required; ``None`` raises).

    Returns:
        ``[N]`` float64 for float64 rewards, float32 otherwise, in flat order.

    Raises:
        InvalidRewardsError: ``k`` is not an int >= 1, a reward is not 0 or 1, or a group has
            fewer than ``k`` trajectories (named). Across ranks every rank raises it (one
            ``all_gather_object``).
    """
    check_batch(batch, "pass_at_k")
    x, layout = working_rewards(batch)
    error = None
    try:
        k = _check_k(k)
        counts = layout.counts
        _check_input(x, layout, k, counts)
    except RLLMTorchError as exc:
        if batch.process_group is None:
            raise
        error = exc
    if batch.process_group is not None:  # every rank raises what any rank found: none waits
        agree_across_ranks(batch.process_group, error, {}, must_match=())
    n_G = torch.as_tensor(counts, dtype=torch.float64, device=x.device)
    c_G = layout.sum(x.to(torch.float64))
    # C(n-c-1, k-1) / C(n-1, k-1) = (n-c-1)! (n-k)! / ((n-c-k)! (n-1)!), 0 when n - c - 1 < k - 1
    wrong_G = n_G - c_G
    lgamma = torch.special.gammaln
    log_ratio_G = lgamma(wrong_G) + lgamma(n_G - k + 1) - lgamma(wrong_G - k + 1) - lgamma(n_G)
    ratio_G = torch.where(wrong_G - 1 >= k - 1, log_ratio_G.exp(), 0.0)
    if k == 1:
        ratio_G = torch.ones_like(ratio_G)  # C(m, 0) = 1: exactly r~ = r
    transformed = torch.where(x == 1, 1.0, 1.0 - layout.expand(ratio_G)).to(x.dtype)
    return layout.flat(transformed)


@shared_docstring
def pass_at_k(batch: GroupedRewards, *, k: int | None = None) -> tuple[Tensor, Tensor]:
    """PKPO advantages for binary rewards: the transformed rewards of :func:`pass_at_k_rewards`,
    centred on their group mean, ``A_i = r~_i - mean_g(r~)``.

    With ``k = 1``, ``r~ = r`` and this is the plain group-mean baseline ``A_i = r_i - mean_g``
    (Dr. GRPO). Larger ``k`` moves credit to the incorrect attempts of groups that solved the
    task: every correct attempt gets ``r~ = 1``, an incorrect one the chance that a ``k``-subset
    containing it still passes, so optimising the sum favours sets of diverse attempts. The
    unbiased estimator's factor ``k / n`` is left out: ``k`` is the same for every group (a
    learning-rate scale) and the loss already averages over trajectories.

    Args:
        {args_batch} Rewards must be binary (0/1 or bool): pass@k is about correct attempts.
        k: the number of attempts pass@k counts, ``1 <= k <= n`` for every non-empty group
            (required: there is no default that would suit every group size).

    Returns:
        {returns}

    Raises:
        InvalidRewardTypeError: ``batch`` is not a GroupedRewards.
        InvalidRewardsError: ``k`` is not an int >= 1; a reward is not 0 or 1 (non-binary rewards
            are refused rather than transformed with the paper's max@k form, whose sort per
            group we do not implement); a group has fewer than ``k`` trajectories. Across ranks
            every rank raises it.

    Edge cases: a group of one (``k = 1`` only) has baseline 0: ``A = r``; an all-correct or
    all-incorrect group gets exactly 0 (``r~`` is constant: 1, or 0).
    Group sums accumulate in float64; the input checks read the rewards (one host sync), so
    unlike the other estimators this one cannot run inside CUDA-graph capture.
    {ranks}
    Collectives per call: the input check's ``all_gather_object``; split groups then 3 (the
    counts, the correct counts, the centring's sums; 4 for float64 rewards, whose centring
    shifts); rank-local groups: none more.

    References: Walder and Karkhanis, "Pass@K Policy Optimization: Solving Harder Reinforcement
    Learning Problems", arXiv:2505.15201 (the binary transformation, Section 3); Chen et al.
    2021, arXiv:2107.03374 (the unbiased pass@k estimator ``1 - C(n - c, k) / C(n, k)``).

    Examples:
        >>> adv, _ = pass_at_k(GroupedRewards.from_groups([[1, 0, 0, 0]]), k=2)
        >>> adv  # r~ = [1, 1/3, 1/3, 1/3]: C(2, 1) / C(3, 1) = 2/3 of the pairs with a wrong one fail
        tensor([ 0.5000, -0.1667, -0.1667, -0.1667])
    """
    transformed = pass_at_k_rewards(batch, k=k)
    layout = batch.layout
    adv = layout.flat(layout.center(layout.values(transformed)).values)
    return adv, adv
