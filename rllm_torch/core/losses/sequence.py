"""Policy losses on one ratio per sequence: GMPO's geometric mean of the clipped token ratios,
and LUSPO's length-weighted GSPO.

Notation as :mod:`~rllm_torch.core.losses.policy`. A sequence's loss ``L_i`` is written on its
tokens (:func:`~rllm_torch.core.losses.aggregation.aggregate_loss` then reduces it), so every
``loss_agg_mode`` is defined; each docstring says which mode gives the peer's scalar.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.losses.aggregation import aggregate_loss, token_mean
from rllm_torch.core.losses.ppo import ppo_clip_loss
from rllm_torch.core.losses.ratio import approx_kl, sequence_mean

__all__ = ["geo_mean_loss", "luspo_loss"]


def geo_mean_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    horizon: int | None = None,
    normaliser: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO, negated: ``L_i = -Ā_i R_i`` with ``R_i = exp(mean_t x̃_t)`` the geometric mean of the
    token ratios clipped in log space by the advantage's sign (``x = log ρ``, ``x_c =
    clamp(x, -clip_ratio_low, clip_ratio_high)``, ``x̃ = sign(A) min(sign(A) x, sign(A) x_c)``:
    the smaller ratio where ``A > 0``, the larger where ``A < 0``) and ``Ā_i`` the sequence's mean
    advantage; ``L_i / |y_i|`` on each of its trained tokens.

    ``loss_agg_mode="seq-mean-token-sum"`` gives verl's ``mean_i L_i``. On-policy
    (``R_i = 1``) the gradient is ``-Ā_i ∇ mean_t log π`` per sequence (GSPO's sequence-level
    REINFORCE); a token clipped on the advantage's side has no gradient. The bounds are log-space
    (verl reads ``clip_ratio_low/high`` so; TRL's experimental GMPO defaults to 0.4).

    Stats: ``clip_fraction`` (tokens with ``x != x_c``), ``approx_kl``.

    Source: Zhao et al., "Geometric-Mean Policy Optimization" (arXiv:2507.20673); verl
    ``loss_mode=geo_mean``.

    Examples:
        >>> logp, adv, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
        >>> geo_mean_loss(logp, logp, adv, mask, loss_agg_mode="seq-mean-token-sum")[0].item()  # -A R = -1
        -1.0
    """
    mask_NT = response_mask.to(log_probs.dtype)
    log_ratio_NT = log_probs - old_log_probs
    sign_NT = torch.sign(advantages)
    clipped_NT = log_ratio_NT.clamp(-clip_ratio_low, clip_ratio_high)
    chosen_NT = sign_NT * torch.minimum(sign_NT * log_ratio_NT, sign_NT * clipped_NT)
    ratio_N1 = sequence_mean(chosen_NT, mask_NT).exp()
    seq_loss_N1 = -sequence_mean(advantages, mask_NT) * ratio_N1
    per_token_NT = seq_loss_N1 / mask_NT.sum(-1, keepdim=True).clamp(min=1.0)
    loss = aggregate_loss(per_token_NT, response_mask, loss_agg_mode, horizon=horizon, normaliser=normaliser)
    stats = {
        "clip_fraction": token_mean((log_ratio_NT != clipped_NT).float(), response_mask),
        "approx_kl": approx_kl(log_ratio_NT, response_mask),
    }
    return loss, stats


def luspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    delta: float | None = None,
    loss_agg_mode: str = "seq-mean-token-sum",
    horizon: int | None = None,
    normaliser: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """LUSPO, negated: PPO's clipped surrogate on GSPO's sequence ratio ``s_i`` (the mean of the
    sequence's token log-ratios, exponentiated), ``ℓ = -min(s_i A, clip(s_i, 1 - ε_low, 1 +
    ε_high) A)`` on every trained token (``delta``: ``s_i`` capped at it in the unclipped term,
    TRL's two-sided clip): :func:`~rllm_torch.core.losses.ppo.ppo_clip_loss` with
    ``importance_sampling_level="sequence"``, the same numbers as ``loss_fn=ppo`` so set.

    Aggregated as ``seq-mean-token-sum`` (its only mode): ``mean_i |y_i| L_i``, each sequence's
    loss weighted by its length, so long responses are not diluted as GSPO's
    length-normalisation dilutes them. On-policy the gradient is ``-A_i ∇ Σ_t log π`` per
    sequence, summed over the batch's sequences and divided by their number.

    Stats: ``clip_fraction`` (tokens whose clipped term is the smaller), ``approx_kl``.

    Raises:
        ValueError: another ``loss_agg_mode``.

    Source: TRL ``loss_type="luspo"`` (length-unbiased sequence policy optimization; TRL warns
    unless ``importance_sampling_level="sequence"``, the only level here; the paper's
    ``epsilon=2e-3``, ``epsilon_high=2.5e-3``).
    """
    if loss_agg_mode != "seq-mean-token-sum":
        raise ValueError(
            f"loss luspo aggregates as seq-mean-token-sum (each sequence's loss times its length, TRL's), not "
            f"{loss_agg_mode!r}: set rllm.algorithm.loss_agg_mode=seq-mean-token-sum."
        )
    return ppo_clip_loss(
        log_probs,
        old_log_probs,
        advantages,
        response_mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        delta=delta,
        importance_sampling_level="sequence",
        loss_agg_mode=loss_agg_mode,
        horizon=horizon,
        normaliser=normaliser,
    )
