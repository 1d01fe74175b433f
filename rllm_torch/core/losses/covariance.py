"""Clip-Cov and KL-Cov: the policy loss restrained on the few tokens whose advantage and
log-probability covary most, the tokens that drive the policy's entropy down.

Notation as :mod:`~rllm_torch.core.losses.policy`. The covariance of a token is
``cov_t = (A_t - mean A) (log π_θ(a_t) - mean log π_θ)``, the means over the trained tokens
the call sees (verl: a micro-batch; here the same, so a selection depends on how rows are split
into micro-batches, as verl's does), computed without gradient. No selection reads tensor data
on the host: the counts are tensors, so both run under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.losses.aggregation import token_mean
from rllm_torch.core.losses.context import LossContext, LossOutput
from rllm_torch.core.losses.declaration import CLIP, backend_settings, builtin_loss
from rllm_torch.core.losses.ratio import approx_kl, clipped_surrogate

__all__ = ["token_covariance", "clip_cov_loss", "kl_cov_loss"]


def token_covariance(advantages: Tensor, log_probs: Tensor, response_mask: Tensor) -> Tensor:
    """``[N, T]`` ``(A - mean A)(log π - mean log π)`` over the trained tokens (means over them),
    without gradient; 0 elsewhere."""
    with torch.no_grad():
        mask_NT = response_mask > 0
        count = mask_NT.sum().clamp(min=1)
        adv_mean = (advantages * mask_NT).sum() / count
        logp_mean = (log_probs * mask_NT).sum() / count
        return torch.where(mask_NT, (advantages - adv_mean) * (log_probs - logp_mean), 0.0)


def _select_by_rank(keys_NT: Tensor, eligible_NT: Tensor, count: Tensor) -> Tensor:
    """``[N, T]`` bool: the ``count`` eligible tokens of largest ``keys`` (fewer if fewer are
    eligible), ranked by one sort (no host sync)."""
    flat = torch.where(eligible_NT, keys_NT, torch.finfo(keys_NT.dtype).min).reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(flat.numel(), device=flat.device))
    return (rank.reshape(keys_NT.shape) < count) & eligible_NT


def _clip_cov_bounds(options) -> str | None:
    lb, ub = options["clip_cov_lb"], options["clip_cov_ub"]
    if lb < ub:
        return None
    return f"it cuts tokens whose covariance lies between clip_cov_lb and clip_cov_ub: clip_cov_lb={lb} must be below clip_cov_ub={ub}"


@builtin_loss(
    "clip_cov",
    CLIP | backend_settings("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub") | {"random_keys": None},
    requirement=_clip_cov_bounds,
)
def clip_cov_loss(
    ctx: LossContext,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    random_keys: Tensor | None = None,
) -> LossOutput:
    """Clip-Cov, negated: PPO's clipped loss ``max(-ρA, -clip(ρ)A)``, with the gradient of a few
    tokens cut: among the trained tokens PPO did not clip whose covariance lies strictly inside
    ``(clip_cov_lb, clip_cov_ub)``, ``max(1, ⌊clip_cov_ratio · n⌋)`` chosen at random
    (``n`` trained tokens) lose their loss (0, and stay in the normaliser).

    On-policy (``ρ = 1``) every token that is not chosen has REINFORCE's gradient.

    Args:
        random_keys: ``[N, T]`` uniform draws that order the eligible tokens (default: drawn with
            ``torch.rand_like``, from torch's generator; a direct call's argument, never a run's).

    Stats: ``clip_fraction`` (tokens whose loss was cut), ``approx_kl``.

    Raises:
        ValueError: ``clip_cov_ratio`` not in ``(0, 1]`` or ``clip_cov_lb >= clip_cov_ub``.

    Source: Cui et al., "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
    Models" (arXiv:2505.22617); verl ``loss_mode=clip_cov`` (``clip_cov_ratio`` 0.0002,
    ``clip_cov_lb`` 1.0, ``clip_cov_ub`` 5.0; verl picks the tokens with ``torch.randperm``).
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    if not 0 < clip_cov_ratio <= 1 or not clip_cov_lb < clip_cov_ub:
        raise ValueError(
            f"clip_cov_ratio={clip_cov_ratio!r} must be in (0, 1], and clip_cov_lb={clip_cov_lb!r} must be below "
            f"clip_cov_ub={clip_cov_ub!r} (backend.clip_cov_ratio, backend.clip_cov_lb, backend.clip_cov_ub)."
        )
    log_ratio_NT = log_probs - old_log_probs
    loss_NT, clipped_NT = clipped_surrogate(
        log_ratio_NT.exp(), advantages, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high
    )
    trained_NT = response_mask > 0
    cov_NT = token_covariance(advantages, log_probs, response_mask)
    eligible_NT = trained_NT & ~clipped_NT & (cov_NT > clip_cov_lb) & (cov_NT < clip_cov_ub)
    count = (clip_cov_ratio * trained_NT.sum()).floor().clamp(min=1)
    keys_NT = torch.rand_like(cov_NT) if random_keys is None else random_keys
    cut_NT = _select_by_rank(keys_NT, eligible_NT, count)
    loss = ctx.aggregate(loss_NT * (~cut_NT), response_mask)
    stats = {
        "clip_fraction": token_mean(cut_NT.float(), response_mask),
        "approx_kl": approx_kl(log_ratio_NT, response_mask),
    }
    return loss, stats


@builtin_loss("kl_cov", backend_settings("kl_cov_ratio", "ppo_kl_coef"))
def kl_cov_loss(ctx: LossContext, *, kl_cov_ratio: float = 0.0002, ppo_kl_coef: float = 0.1) -> LossOutput:
    """KL-Cov, negated: the unclipped ``-ρA`` on every token, plus ``ppo_kl_coef |log ρ|`` on the
    ``max(1, ⌊kl_cov_ratio · n⌋)`` trained tokens of largest covariance (``n`` trained tokens).

    On-policy the penalty's value is 0 and its gradient ``ppo_kl_coef sign(0) = 0``, so the
    gradient is REINFORCE's; off-policy the chosen tokens are pulled back towards ``π_old``.

    Stats: ``kl_cov_fraction`` (penalised tokens), ``approx_kl``.

    Raises:
        ValueError: ``kl_cov_ratio`` not in ``(0, 1]`` or ``ppo_kl_coef < 0``.

    Source: arXiv:2505.22617 (as :func:`clip_cov_loss`); verl ``loss_mode=kl_cov``
    (``kl_cov_ratio`` 0.0002, ``ppo_kl_coef`` 0.1).
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    if not 0 < kl_cov_ratio <= 1 or not ppo_kl_coef >= 0:
        raise ValueError(
            f"kl_cov_ratio={kl_cov_ratio!r} must be in (0, 1] and ppo_kl_coef={ppo_kl_coef!r} >= 0 "
            "(backend.kl_cov_ratio, backend.ppo_kl_coef)."
        )
    log_ratio_NT = log_probs - old_log_probs
    trained_NT = response_mask > 0
    cov_NT = token_covariance(advantages, log_probs, response_mask)
    count = (kl_cov_ratio * trained_NT.sum()).floor().clamp(min=1)
    chosen_NT = _select_by_rank(cov_NT, trained_NT, count)
    loss_NT = -advantages * log_ratio_NT.exp() + ppo_kl_coef * log_ratio_NT.abs() * chosen_NT
    loss = ctx.aggregate(loss_NT, response_mask)
    stats = {
        "kl_cov_fraction": token_mean(chosen_NT.float(), response_mask),
        "approx_kl": approx_kl(log_ratio_NT, response_mask),
    }
    return loss, stats
