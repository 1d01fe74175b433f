"""DPPO: drop a token whose probability moved past a divergence bound in the direction its
advantage pushes, instead of clipping its ratio (verl's ``dppo_tv`` and ``dppo_kl``, two
declarations of :func:`dppo_loss`; prime-rl's default loss is the TV form).

Notation as :mod:`~rllm_torch.core.losses.policy`; ``p = π_θ(a_t)`` and ``p_old = π_old(a_t)``
the sampled token's probabilities.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.losses.aggregation import token_mean
from rllm_torch.core.losses.context import LossContext, LossOutput
from rllm_torch.core.losses.declaration import CLIP, BuiltinLoss, backend_settings
from rllm_torch.core.losses.ratio import LOG_RATIO_CLAMP, approx_kl

__all__ = ["dppo_loss", "dppo_tv_loss", "dppo_kl_loss", "dppo_keep_mask"]


def dppo_keep_mask(
    log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, *, divergence: str, low: float, high: float
) -> Tensor:
    """``[N, T]`` bool (no gradient): the tokens DPPO keeps.

    ``divergence="tv"``: where ``A > 0``, keep if ``p - p_old <= high``; elsewhere if
    ``p - p_old >= -low`` (a token whose probability already rose, resp. fell, past the bound is
    dropped). ``"kl"``: the binary KL ``D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) /
    (1 - p))`` (with 1e-8 inside the second log, as verl); where ``A > 0``, keep if ``D <= high``
    or ``p <= p_old``; elsewhere if ``D <= low`` or ``p >= p_old``.

    Raises:
        ValueError: ``divergence`` is neither.
    """
    with torch.no_grad():
        p, p_old = log_probs.exp(), old_log_probs.exp()
        positive = advantages > 0
        if divergence == "tv":
            return torch.where(positive, p - p_old <= high, p - p_old >= -low)
        if divergence == "kl":
            binary_kl = p_old * (old_log_probs - log_probs) + (1 - p_old) * torch.log(
                (1 - p_old + 1e-8) / (1 - p + 1e-8)
            )
            return torch.where(positive, (binary_kl <= high) | (p <= p_old), (binary_kl <= low) | (p >= p_old))
    raise ValueError(f"divergence={divergence!r} is not 'tv' or 'kl'.")


def dppo_loss(
    ctx: LossContext,
    *,
    divergence: str = "tv",
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = None,
) -> LossOutput:
    """DPPO, negated: ``ℓ = -A sg(min(ρ, C)) log π_θ`` on the tokens :func:`dppo_keep_mask` keeps
    (``divergence`` ``"tv"`` or ``"kl"``, the losses ``dppo_tv`` and ``dppo_kl``; bounds
    ``clip_ratio_low`` / ``clip_ratio_high``), 0 on the dropped ones, which stay in the loss's
    normaliser (as verl).

    The gradient of a kept token is ``-A min(ρ, C) ∇ log π`` (``C = clip_ratio_c``, None: no cap;
    verl's config default is 3.0); on-policy every token is kept and it is REINFORCE's
    ``-A ∇ log π``. Unlike PPO's clip, a dropped token has no gradient at all, and a token whose
    probability moved against its advantage is never dropped.

    Stats: ``clip_fraction`` (dropped tokens), ``clip_fraction_lower`` (kept tokens with
    ``ρ > C``), ``approx_kl``.

    Raises:
        ValueError: ``divergence`` is neither.

    Source: "Divergence-based Proximal Policy Optimization" (arXiv:2602.04879); verl
    ``loss_mode=dppo_tv`` / ``dppo_kl`` (its bounds are ``clip_ratio_low/high``); prime-rl's default
    loss (TV, bounds ``dppo_mask_low/high`` 0.2, against the sampler's log-probs, plus a
    ``kl_tau (log ρ)²`` term not taken here).
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    keep_NT = dppo_keep_mask(
        log_probs, old_log_probs, advantages, divergence=divergence, low=clip_ratio_low, high=clip_ratio_high
    )
    log_ratio_NT = (log_probs - old_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio_NT = log_ratio_NT.detach().exp()
    weight_NT = ratio_NT if clip_ratio_c is None else ratio_NT.clamp(max=clip_ratio_c)
    loss_NT = -advantages * weight_NT * log_probs * keep_NT
    loss = ctx.aggregate(loss_NT, response_mask)
    with torch.no_grad():
        stats = {"clip_fraction": token_mean((~keep_NT).float(), response_mask)}
        if clip_ratio_c is not None:
            capped_NT = (ratio_NT > clip_ratio_c) & keep_NT
            stats["clip_fraction_lower"] = token_mean(capped_NT.float(), response_mask)
    return loss, stats | {"approx_kl": approx_kl(log_ratio_NT, response_mask)}


#: DPPO with the total-variation bound: :func:`dppo_loss` with ``divergence="tv"``.
dppo_tv_loss = BuiltinLoss("dppo_tv", dppo_loss, CLIP | backend_settings("clip_ratio_c"), fixed={"divergence": "tv"})
#: DPPO with the binary-KL bound: :func:`dppo_loss` with ``divergence="kl"``.
dppo_kl_loss = BuiltinLoss("dppo_kl", dppo_loss, CLIP | backend_settings("clip_ratio_c"), fixed={"divergence": "kl"})
