"""Policy losses that weigh each token smoothly instead of clipping it: SAPO's soft gate of the
ratio, and VESPO's variational weight of the sequence ratio.

Notation as :mod:`~rllm_torch.core.losses.policy`: ``[N, T]`` tensors ``log_probs`` (with
gradient), ``old_log_probs``, ``advantages``, ``response_mask``; ``ρ = π_θ / π_old``; ``sg``
stops the gradient. Each returns ``(loss, stats)`` aggregated by ``agg``.
"""

from __future__ import annotations

import math

import torch

from rllm_torch.core.losses.aggregation import token_mean
from rllm_torch.core.losses.context import LossContext, LossOutput
from rllm_torch.core.losses.declaration import LEVEL, backend_settings, builtin_loss
from rllm_torch.core.losses.ratio import LOG_RATIO_CLAMP, approx_kl, log_importance_ratio

__all__ = ["sapo_loss", "vespo_loss"]


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}={value!r} must be a finite number > 0 (the backend setting backend.{name}).")
    return float(value)


@builtin_loss("sapo", backend_settings("tau_pos", "tau_neg") | LEVEL)
def sapo_loss(
    ctx: LossContext, *, tau_pos: float = 1.0, tau_neg: float = 1.05, importance_sampling_level: str = "token"
) -> LossOutput:
    """SAPO, negated: ``ℓ = -(4 / τ) σ(τ (ρ - 1)) A``, with ``τ = tau_pos`` where ``A > 0`` and
    ``tau_neg`` elsewhere, and ``log ρ`` clamped to ``[-20, 20]`` (as verl).

    The gate replaces PPO's hard clip by a sigmoid of the ratio: its slope ``4 σ'(τ(ρ - 1))`` is 1
    at ``ρ = 1`` and falls smoothly as ``ρ`` leaves it, so off-policy tokens fade instead of
    stopping. On-policy (``ρ = 1``) the gradient is REINFORCE's ``-A ∇ log π`` (the value is
    ``-(2/τ) A``). ``importance_sampling_level="sequence"`` gates GSPO's sequence ratio (TRL).

    Stats: ``approx_kl``.

    Raises:
        ValueError: ``tau_pos`` or ``tau_neg`` not a finite number > 0.

    Source: SAPO, "Soft Adaptive Policy Optimization" (Qwen, arXiv:2511.20347); verl
    ``loss_mode=sapo`` (``actor.tau_pos`` 1.0, ``actor.tau_neg`` 1.05; verl always aggregates it
    as ``seq-mean-token-mean``, here ``agg`` decides), TRL ``loss_type="sapo"``
    (``sapo_temperature_pos/neg``; TRL does not clamp the log-ratio).

    Examples:
        >>> logp, adv, mask = torch.tensor([[-1.0]]), torch.tensor([[2.0]]), torch.tensor([[1.0]])
        >>> round(sapo_loss(logp, logp, adv, mask)[0].item(), 4)  # -(4/1) sigmoid(0) 2 = -4
        -4.0
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    tau_pos, tau_neg = _positive(tau_pos, "tau_pos"), _positive(tau_neg, "tau_neg")
    log_ratio = log_importance_ratio(log_probs, old_log_probs, response_mask, importance_sampling_level)
    ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp()
    # filled from Python numbers on the device (a new_tensor per value would copy from the host: a sync on CUDA)
    tau_NT = torch.full_like(advantages, tau_neg, dtype=ratio.dtype).masked_fill_(advantages > 0, tau_pos)
    gate_NT = torch.sigmoid(tau_NT * (ratio - 1.0)) * (4.0 / tau_NT)
    loss = ctx.aggregate(-gate_NT * advantages, response_mask)
    return loss, {"approx_kl": approx_kl(log_probs - old_log_probs, response_mask)}


@builtin_loss("vespo", backend_settings("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"))
def vespo_loss(
    ctx: LossContext,
    *,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
) -> LossOutput:
    """VESPO, negated: ``ℓ = -sg(φ(w)) A log π_θ`` with ``w`` the sequence's importance weight
    ``exp(Σ_t m clamp(log ρ_t, ±20))`` (a product, not GSPO's mean; ``log w`` clamped to
    ``[log 1e-8, 20]``) and ``φ(w) = w^k exp(λ (1 - w))``, ``(k, λ) = (vespo_k_pos,
    vespo_lambda_pos)`` where ``A >= 0``, the ``_neg`` pair elsewhere (``λ`` at least 1e-4; TRL's
    advantage is per sequence, here the pair is chosen per token, which is the same for it).

    ``φ(1) = 1``, so on-policy the gradient is REINFORCE's ``-A ∇ log π``; far from ``w = 1`` the
    weight decays (a gamma-shaped envelope), so stale or off-policy sequences weigh less without
    a hard clip. A non-finite ``φ`` is 0.

    Stats: ``phi_mean`` (``φ`` over trained tokens; TRL logs it per sequence) and ``approx_kl``.

    Source: TRL ``loss_type="vespo"`` (``vespo_k_pos`` 2.0, ``vespo_lambda_pos`` 3.0, ``vespo_k_neg``
    3.0, ``vespo_lambda_neg`` 2.0; aggregated as its ``dapo``, the global token mean: ``loss_agg_mode``
    ``token-mean``).

    Examples:
        >>> logp, adv, mask = torch.tensor([[-1.0]]), torch.tensor([[2.0]]), torch.tensor([[1.0]])
        >>> vespo_loss(logp, logp, adv, mask)[0].item()  # phi(1) = 1: -A log pi = 2
        2.0
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    mask_NT = response_mask.to(log_probs.dtype)
    log_ratio_NT = (log_probs - old_log_probs).detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    log_w_N1 = (log_ratio_NT * mask_NT).sum(-1, keepdim=True).clamp(math.log(1e-8), LOG_RATIO_CLAMP)
    positive_NT = advantages >= 0  # TRL's advantage is per sequence; here per token (the same there)
    k_NT = torch.full_like(advantages, vespo_k_neg, dtype=log_w_N1.dtype).masked_fill_(positive_NT, vespo_k_pos)
    lam_NT = torch.full_like(advantages, vespo_lambda_neg, dtype=log_w_N1.dtype).masked_fill_(
        positive_NT, vespo_lambda_pos
    )
    lam_NT = lam_NT.clamp(min=1e-4)
    phi_NT = torch.exp(lam_NT + k_NT * log_w_N1 - lam_NT * log_w_N1.exp())
    phi_NT = torch.nan_to_num(phi_NT, nan=0.0, posinf=0.0, neginf=0.0)
    loss = ctx.aggregate(-phi_NT * advantages * log_probs, response_mask)
    with torch.no_grad():
        stats = {"phi_mean": token_mean(phi_NT, response_mask)}
    return loss, stats | {"approx_kl": approx_kl(log_probs - old_log_probs, response_mask)}
