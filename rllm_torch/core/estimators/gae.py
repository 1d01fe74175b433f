"""Generalized Advantage Estimation (GAE) over token rewards and critic values."""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.errors import InvalidRewardsError
from rllm_torch.core.estimators.scaling import (
    check_correction,
    check_discount,
    check_epsilon,
    check_flag,
    check_token_batch,
    shared_docstring,
)
from rllm_torch.core.returns import discounted_returns, whiten_over
from rllm_torch.core.tokens import TokenRewards

__all__ = ["gae", "next_trained_values"]


def next_trained_values(values: Tensor, mask: Tensor) -> Tensor:
    """``[B, T]``: at each position, the value of the row's next trained token after it (0 after
    the last one), ``V_{next(t)}``: one reverse running minimum over the trained positions and a
    gather, no loop."""
    num_rows, width = values.shape
    positions_T = torch.arange(width, device=values.device)
    trained_at = torch.where(mask > 0, positions_T, width)  # [B, T]: the position, or T (none)
    first_from = trained_at.flip(-1).cummin(-1).values.flip(-1)  # the first trained position >= t
    next_BT = torch.cat([first_from[:, 1:], first_from.new_full((num_rows, 1), width)], dim=1)
    padded = torch.cat([values, values.new_zeros(num_rows, 1)], dim=1)  # column T: after the end, value 0
    return padded.gather(1, next_BT)


@shared_docstring
def gae(
    batch: TokenRewards,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    epsilon: float = 1e-6,
    std_correction: int = 0,
) -> tuple[Tensor, Tensor]:
    """GAE advantages from token rewards and the critic's values.

    ``delta_t = r_t + gamma V_{{next(t)}} - V_t`` at each trained token, with ``next(t)`` the
    response's next trained token (``V = 0`` after the last), then
    ``A_t = sum_{{s >= t}} (gamma lam)^d(t, s) delta_s`` over the trained tokens (``d`` counts
    the trained tokens in ``[t, s)``), ``returns = A + V`` (the critic's regression target) and,
    with ``whiten``, ``A`` whitened over every trained token of the batch.

    Args:
        {args_tokens} ``batch.values`` must hold the critic's values.
        gamma: the discount, in ``[0, 1]``.
        lam: GAE's ``lambda`` in ``[0, 1]``: 1 gives Monte-Carlo returns minus the value, 0 the
            one-step TD error.
        whiten: whiten the advantages over the batch (verl always does).
        epsilon, std_correction: of the whitening's std (see ``reinforce_plus_plus``).

    Returns:
        {returns_tokens} ``returns`` are ``A + V`` before whitening.

    Raises:
        InvalidRewardTypeError: ``batch`` is not a TokenRewards, or ``whiten`` not a bool.
        InvalidRewardsError: ``batch.values`` is None (configure a critic), ``gamma`` or ``lam``
            outside ``[0, 1]``, ``epsilon`` negative, or ``std_correction`` not a non-negative int.

    Edge cases: untrained tokens inside a response are skipped (as verl, which carries the next
    value and the running advantage through them); a batch with no trained token gives zeros.
    Accumulates in float32 (float64 for float64 input). No host sync; ``gamma lam < 1`` scans
    over ``T`` (:func:`~rllm_torch.core.returns.discounted_returns`).
    {ranks_tokens}

    References: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv:1506.02438 (eq. 16); Ouyang et al. 2022, arXiv:2203.02155 (PPO with a
    critic for LLMs); verl ``compute_gae_advantage_return``.

    Examples:
        >>> rewards, values = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]])
        >>> adv, returns = gae(TokenRewards(rewards, torch.ones(1, 2), values=values), whiten=False)
        >>> adv, returns  # delta = [0 + 0.5 - 0.5, 1 + 0 - 0.5]
        (tensor([[0.5000, 0.5000]]), tensor([[1., 1.]]))
    """
    check_token_batch(batch, "gae")
    gamma, lam = check_discount(gamma, "gamma"), check_discount(lam, "lam")
    check_flag(whiten, "whiten")
    epsilon, std_correction = check_epsilon(epsilon), check_correction(std_correction)
    if batch.values is None:
        raise InvalidRewardsError(
            "gae needs the critic's values: TokenRewards(rewards, mask, values=values_BT); in a training run, "
            "configure a critic with backend.critic.enable=true."
        )
    rewards, mask = batch.working()
    values = batch.values.detach().to(rewards.dtype) * mask
    delta = (rewards + gamma * next_trained_values(values, mask) - values).mul_(mask)
    adv = discounted_returns(delta, mask, gamma * lam)
    returns = (adv + values).mul_(mask)
    if whiten:
        adv = whiten_over(adv, mask, epsilon, std_correction, batch.process_group)
    return adv, returns
