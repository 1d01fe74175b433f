"""Policy losses on token tensors, aggregated as a token mean (pure functions).

Shapes: ``N`` sequences, ``T`` tokens. All inputs are ``[N, T]`` float tensors on one device;
``response_mask`` is 1 on trained tokens. The token mean is ``sum(loss * mask) / max(sum(mask), 1)``
(one mean over every response token of the batch, as DAPO's token-level loss, arXiv:2503.14476).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["token_mean", "ppo_clip_loss", "importance_sampling_loss", "policy_loss", "LOSS_FNS"]

LOSS_FNS = ("ppo", "importance_sampling")


def token_mean(values: Tensor, response_mask: Tensor) -> Tensor:
    """Mean of ``values [N, T]`` over the tokens where ``response_mask [N, T]`` is 1 (0 if none)."""
    return (values * response_mask).sum() / response_mask.sum().clamp(min=1.0)


def ppo_clip_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7), negated:
    ``-min(ρ A, clip(ρ, 1 - ε_low, 1 + ε_high) A)`` with ``ρ = exp(log_probs - old_log_probs)``.

    Returns:
        ``(loss, stats)``: the scalar token-mean loss and detached ``clip_fraction`` and
        ``approx_kl`` (token means of the clipped share and of ``(ρ - 1) - log ρ``).
    """
    log_ratio_NT = log_probs - old_log_probs
    ratio_NT = log_ratio_NT.exp()
    unclipped_NT = ratio_NT * advantages
    clipped_NT = ratio_NT.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high) * advantages
    loss = token_mean(-torch.minimum(unclipped_NT, clipped_NT), response_mask)
    with torch.no_grad():
        stats = {"clip_fraction": token_mean((clipped_NT < unclipped_NT).float(), response_mask), "approx_kl": token_mean(ratio_NT - 1 - log_ratio_NT, response_mask)}
    return loss, stats


def importance_sampling_loss(log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
    """The unclipped importance-weighted policy gradient, negated: ``-ρ A`` with
    ``ρ = exp(log_probs - old_log_probs)`` (tinker's ``importance_sampling`` loss). On-policy
    (ρ = 1) its gradient is REINFORCE's ``-A ∇ log π``."""
    log_ratio_NT = log_probs - old_log_probs
    ratio_NT = log_ratio_NT.exp()
    loss = token_mean(-ratio_NT * advantages, response_mask)
    with torch.no_grad():
        stats = {"approx_kl": token_mean(ratio_NT - 1 - log_ratio_NT, response_mask)}
    return loss, stats


def policy_loss(name: str, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> tuple[Tensor, dict[str, Tensor]]:
    """Dispatch on ``name`` (one of :data:`LOSS_FNS`).

    Raises:
        ValueError: an unknown loss name.
    """
    if name == "ppo":
        return ppo_clip_loss(log_probs, old_log_probs, advantages, response_mask, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    if name == "importance_sampling":
        return importance_sampling_loss(log_probs, old_log_probs, advantages, response_mask)
    raise ValueError(f"loss {name!r} is not one of {LOSS_FNS}.")
