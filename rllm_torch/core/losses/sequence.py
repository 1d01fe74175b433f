"""Policy losses on one ratio per sequence: GMPO's geometric mean of the clipped token ratios,
and LUSPO's length-weighted GSPO.

Notation as :mod:`~rllm_torch.core.losses.policy`. A sequence's loss ``L_i`` is written on its
tokens (:func:`~rllm_torch.core.losses.aggregation.aggregate_loss` then reduces it), so every
``loss_agg_mode`` is defined; each docstring says which mode gives the peer's scalar.
"""

from __future__ import annotations

import torch

from rllm_torch.core.losses.aggregation import token_mean
from rllm_torch.core.losses.context import LossContext, LossOutput
from rllm_torch.core.losses.declaration import CLIP, BuiltinLoss, backend_settings, builtin_loss
from rllm_torch.core.losses.ppo import ppo_clip_loss
from rllm_torch.core.losses.ratio import approx_kl, sequence_mean

__all__ = ["geo_mean_loss", "luspo_loss"]


@builtin_loss("geo_mean", CLIP)
def geo_mean_loss(ctx: LossContext, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2) -> LossOutput:
    """GMPO, negated: ``L_i = -Ā_i R_i`` with ``R_i = exp(mean_t x̃_t)`` the geometric mean of the
    token ratios clipped in log space by the advantage's sign (``x = log ρ``, ``x_c =
    clamp(x, -clip_ratio_low, clip_ratio_high)``, ``x̃ = sign(A) min(sign(A) x, sign(A) x_c)``:
    the smaller ratio where ``A > 0``, the larger where ``A < 0``) and ``Ā_i`` the sequence's mean
    advantage; ``L_i / |y_i|`` on each of its trained tokens.

    ``agg=Aggregation("seq-mean-token-sum")`` gives verl's ``mean_i L_i``. On-policy
    (``R_i = 1``) the gradient is ``-Ā_i ∇ mean_t log π`` per sequence (GSPO's sequence-level
    REINFORCE); a token clipped on the advantage's side has no gradient. The bounds are log-space
    (verl reads ``clip_ratio_low/high`` so; TRL's experimental GMPO defaults to 0.4).

    Stats: ``clip_fraction`` (tokens with ``x != x_c``), ``approx_kl``.

    Source: Zhao et al., "Geometric-Mean Policy Optimization" (arXiv:2507.20673); verl
    ``loss_mode=geo_mean``.

    Examples:
        >>> logp, adv, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[1.0, 1.0]]), torch.ones(1, 2)
        >>> from rllm_torch.core.losses.aggregation import Aggregation
        >>> geo_mean_loss(logp, logp, adv, mask, agg=Aggregation("seq-mean-token-sum"))[0].item()  # -A R = -1
        -1.0
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    mask_NT = response_mask.to(log_probs.dtype)
    log_ratio_NT = log_probs - old_log_probs
    sign_NT = torch.sign(advantages)
    clipped_NT = log_ratio_NT.clamp(-clip_ratio_low, clip_ratio_high)
    chosen_NT = sign_NT * torch.minimum(sign_NT * log_ratio_NT, sign_NT * clipped_NT)
    ratio_N1 = sequence_mean(chosen_NT, mask_NT).exp()
    seq_loss_N1 = -sequence_mean(advantages, mask_NT) * ratio_N1
    per_token_NT = seq_loss_N1 / mask_NT.sum(-1, keepdim=True).clamp(min=1.0)
    loss = ctx.aggregate(per_token_NT, response_mask)
    stats = {
        "clip_fraction": token_mean((log_ratio_NT != clipped_NT).float(), response_mask),
        "approx_kl": approx_kl(log_ratio_NT, response_mask),
    }
    return loss, stats


def _luspo_mode(options) -> str | None:
    mode = options["loss_agg_mode"]
    if mode == "seq-mean-token-sum":
        return None
    return (
        f"luspo weights each sequence's loss by its length (TRL's LUSPO): it needs loss_agg_mode=seq-mean-token-sum, "
        f"not {mode!r} (set rllm.algorithm.loss_agg_mode=seq-mean-token-sum)"
    )


luspo_loss = BuiltinLoss(
    "luspo",
    ppo_clip_loss.fn,
    CLIP | backend_settings("delta"),
    fixed={"importance_sampling_level": "sequence", "clip_ratio_c": None},
    agg_mode="seq-mean-token-sum",
    requirement=_luspo_mode,
    module=__name__,
    doc="""LUSPO, negated: PPO's clipped surrogate on GSPO's sequence ratio ``s_i`` (the mean of the
    sequence's token log-ratios, exponentiated), ``ℓ = -min(s_i A, clip(s_i, 1 - ε_low, 1 +
    ε_high) A)`` on every trained token (``delta``: ``s_i`` capped at it in the unclipped term,
    TRL's two-sided clip): :func:`~rllm_torch.core.losses.ppo.ppo_clip_loss` with
    ``importance_sampling_level="sequence"``, the same numbers as ``loss_fn=ppo`` so set.

    Aggregated as ``seq-mean-token-sum`` (its only mode, pinned; another one is refused):
    ``mean_i |y_i| L_i``, each sequence's loss weighted by its length, so long responses are not
    diluted as GSPO's length-normalisation dilutes them. On-policy the gradient is ``-A_i ∇ Σ_t log π``
    per sequence, summed over the batch's sequences and divided by their number.

    Stats: ``clip_fraction`` (tokens whose clipped term is the smaller), ``approx_kl``.

    Raises ``ValueError`` with another aggregation mode.

    Source: TRL ``loss_type="luspo"`` (length-unbiased sequence policy optimization; TRL warns
    unless ``importance_sampling_level="sequence"``, the only level here; the paper's
    ``epsilon=2e-3``, ``epsilon_high=2.5e-3``).
    """,
)
