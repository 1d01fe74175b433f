"""The optimal token baseline (OTB): a per-position baseline shared by the responses of a prompt,
weighted by how much each response's gradient at that position can vary."""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidRewardsError
from rllm_torch.core.estimators.scaling import check_token_batch
from rllm_torch.core.tokens import TokenRewards

__all__ = ["optimal_token_baseline"]


def optimal_token_baseline(batch: TokenRewards) -> tuple[Tensor, Tensor]:
    """OTB advantages ``A_t = G_t - B_t`` on each trained token.

    With ``G_t`` the return to go (``γ = 1``, untrained tokens skipped) and, on the ``k``-th
    trained token of a response, ``w_k = 1 - 2 π_old(a_k) + Σ_v π_old(v)²`` (times the squared
    importance weight, with rollout correction) and ``W_k = Σ_{j <= k} w_j``, the baseline of
    position ``k`` in a prompt group is ``B_k = Σ_i G_k^i W_k^i / (Σ_i W_k^i + 1e-8)`` over the
    group's responses that reach ``k``: the variance-minimising baseline of the policy gradient
    when ``W`` approximates the squared norm of the score function accumulated up to ``k``.
    Positions are counted over each response's trained tokens (verl's multi-turn variant, the
    same as its plain one for contiguous responses).

    Args:
        batch: ``TokenRewards`` with ``old_log_probs``, ``sum_pi_squared`` and ``group_index``
            (``importance_weights`` optional); ``group_index`` holds dense ids ``0 .. G - 1``
            (so ``G <= B``). Groups must be whole on this process or rank (the trainer's layout):
            no collective, and no host sync (the ``(group, position)`` sums live in ``B * T`` slots).

    Returns:
        ``(advantages [B, T], returns [B, T])`` float32 (float64 for float64 rewards), 0 off the
        mask; the returns are ``G``. A group of one response gets baseline 0; where a group's
        longest response is unique, its positions beyond the second longest have no other
        response to compare with and get baseline 0 too (verl's ``handle_zero_tail``, on).

    Raises:
        InvalidRewardTypeError: not a TokenRewards. InvalidRewardsError: a missing input.

    References: "The Optimal Token Baseline" (arXiv:2602.07078); verl
    ``adv_estimator=optimal_token_baseline`` (and ``actor.calculate_sum_pi_squared``).

    Examples:
        >>> r, m = torch.tensor([[0.0, 1.0], [0.0, 0.0]]), torch.ones(2, 2)
        >>> lp, sq = torch.log(torch.full((2, 2), 0.5)), torch.full((2, 2), 0.5)  # w = 1 - 1 + 0.5
        >>> batch = TokenRewards(r, m, old_log_probs=lp, sum_pi_squared=sq, group_index=torch.tensor([0, 0]))
        >>> optimal_token_baseline(batch)[0]
        tensor([[ 0.5000,  0.5000],
                [-0.5000, -0.5000]])
    """
    batch = check_token_batch(batch, "optimal_token_baseline")
    for name in ("old_log_probs", "sum_pi_squared", "group_index"):
        if getattr(batch, name) is None:
            raise InvalidRewardsError(
                f"optimal_token_baseline needs TokenRewards.{name} (the trainer computes sum_pi_squared in the old "
                "log-prob pass when rllm.algorithm.adv_estimator=optimal_token_baseline)."
            )
    rewards = batch.token_level_rewards
    dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    mask_BT = (batch.response_mask != 0).to(dtype)
    g = batch.group_index
    num_rows, width = mask_BT.shape
    # the return to go over trained tokens (untrained ones skipped: they neither add nor discount)
    rewards_BT = rewards.to(dtype) * mask_BT
    returns_BT = rewards_BT.flip(-1).cumsum(-1).flip(-1) * mask_BT
    w_BT = 1.0 - 2.0 * batch.old_log_probs.to(dtype).exp() + batch.sum_pi_squared.to(dtype)
    if batch.importance_weights is not None:
        w_BT = w_BT * batch.importance_weights.to(dtype).square()
    cum_w_BT = (w_BT * mask_BT).cumsum(-1)
    # each trained token's position among its response's trained tokens
    position_BT = (mask_BT.cumsum(-1) - 1).clamp(min=0).long()
    lengths_B = mask_BT.sum(-1).long()
    # dense group ids are below B, so B * T (group, position) slots hold every key: no host sync
    key_BT = (g[:, None] * width + position_BT).reshape(-1)
    numerator = rewards_BT.new_zeros(num_rows * width).index_add_(0, key_BT, (returns_BT * cum_w_BT * mask_BT).view(-1))
    denominator = rewards_BT.new_zeros(num_rows * width).index_add_(0, key_BT, (cum_w_BT * mask_BT).view(-1))
    baseline_BT = (numerator / (denominator + 1e-8))[key_BT].view(num_rows, width) * mask_BT
    longest_B = torch.zeros_like(lengths_B).scatter_reduce_(0, g, lengths_B, "amax")[g]
    is_longest_B = lengths_B == longest_B
    count_longest_B = torch.zeros_like(lengths_B).index_add_(0, g, is_longest_B.long())[g]
    shorter_B = torch.where(is_longest_B, 0, lengths_B)
    second_B = torch.zeros_like(lengths_B).scatter_reduce_(0, g, shorter_B, "amax")[g]
    unique_B = is_longest_B & (count_longest_B == 1)
    # a unique longest response's positions past the second longest have baseline 0: the whole of
    # a group of one's response (its second longest is 0)
    zero_BT = unique_B[:, None] & (position_BT >= second_B[:, None])
    baseline_BT = torch.where(zero_BT, 0.0, baseline_BT)
    advantages_BT = (returns_BT - baseline_BT) * mask_BT
    return advantages_BT, returns_BT
