"""PPO's clipped surrogate loss (``ppo``) and the two names declared on it: GSPO (``gspo``: the
same loss on the sequence ratio, its aggregation pinned) and verl's ``vanilla`` (the same loss,
dual-clipped at verl's ``clip_ratio_c = 3`` unless set). LUSPO, a third, is declared in
:mod:`~rllm_torch.core.losses.sequence`.

Notation as :mod:`~rllm_torch.core.losses.policy`; the surrogate, the ratio and the dual clip are
:mod:`~rllm_torch.core.losses.ratio`'s.
"""

from __future__ import annotations

from rllm_torch.core.losses.aggregation import token_mean
from rllm_torch.core.losses.context import LossContext, LossOutput
from rllm_torch.core.losses.declaration import CLIP, LEVEL, BuiltinLoss, backend_settings, builtin_loss
from rllm_torch.core.losses.ratio import approx_kl, clipped_surrogate, dual_clip, log_importance_ratio

__all__ = ["ppo_clip_loss", "gspo_loss", "vanilla_loss", "VERL_CLIP_RATIO_C"]

#: verl's ``actor.clip_ratio_c`` default (verl/workers/config/actor.py), which its ``vanilla`` loss reads.
VERL_CLIP_RATIO_C = 3.0


@builtin_loss("ppo", CLIP | backend_settings("clip_ratio_c", "delta") | LEVEL)
def ppo_clip_loss(
    ctx: LossContext,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = None,
    delta: float | None = None,
    importance_sampling_level: str = "token",
) -> LossOutput:
    """PPO's clipped surrogate, negated: ``ℓ = -min(ρ A, clip(ρ, 1 - ε_low, 1 + ε_high) A)``;
    with ``clip_ratio_c = c`` (dual clip) ``ℓ = min(ℓ, -c A)`` where ``A < 0``; with ``delta = δ``
    (TRL's two-sided clip, INTELLECT-2) ``ρ`` is capped at ``δ`` in the unclipped term,
    ``ℓ = -min(min(ρ, δ) A, clip(ρ) A)``: for ``δ >= 1 + ε_high`` the same loss as ``clip_ratio_c = δ``.

    Stats: ``clip_fraction`` (share of tokens where the clipped term is the smaller),
    ``clip_fraction_lower`` (share capped by the dual clip, with ``clip_ratio_c``) and ``approx_kl``.

    Source: Schulman et al. 2017, arXiv:1707.06347, eq. 7; asymmetric ε_low/ε_high as DAPO
    (arXiv:2503.14476); dual clip and the sequence ratio: :mod:`~rllm_torch.core.losses.ratio`;
    ``delta``: TRL's ``GRPOConfig.delta`` (Prime Intellect, INTELLECT-2, arXiv:2505.07291).
    Example: on-policy, ``A = 2`` on one token gives ``ℓ = -2``.
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    ratio_NT = log_importance_ratio(log_probs, old_log_probs, response_mask, importance_sampling_level).exp()
    loss_NT, clipped_NT = clipped_surrogate(
        ratio_NT, advantages, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, delta=delta
    )
    stats = {}
    if clip_ratio_c is not None:
        loss_NT, capped_NT = dual_clip(loss_NT, advantages, clip_ratio_c)
        stats["clip_fraction_lower"] = token_mean(capped_NT.float(), response_mask)
    loss = ctx.aggregate(loss_NT, response_mask)
    stats["clip_fraction"] = token_mean(clipped_NT.float(), response_mask)
    return loss, stats | {"approx_kl": approx_kl(log_probs - old_log_probs, response_mask)}


gspo_loss = BuiltinLoss(
    "gspo",
    ppo_clip_loss.fn,
    CLIP | LEVEL,
    fixed={"importance_sampling_level": "sequence", "clip_ratio_c": None, "delta": None},
    agg_mode="seq-mean-token-mean",
    module=__name__,
    doc="""GSPO under its own loss name (rLLM's, verl's and Fireworks' ``gspo``): :func:`ppo_clip_loss`
    on the length-normalised sequence ratio ``s_i = (π_θ(y_i) / π_old(y_i))^(1/|y_i|)`` whatever
    ``importance_sampling_level`` the run sets, aggregated ``seq-mean-token-mean`` (its pinned
    mode, :data:`~rllm_torch.core.losses.policy.PINNED_AGG_MODES`, as rLLM pins it). The same numbers
    as ``loss_fn=ppo`` with ``importance_sampling_level=sequence`` and ``loss_agg_mode=seq-mean-token-mean``.

    Source: Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071.
    """,
)

vanilla_loss = BuiltinLoss(
    "vanilla",
    ppo_clip_loss.fn,
    CLIP | backend_settings("clip_ratio_c"),
    fixed={"importance_sampling_level": "token", "delta": None},
    when_none={"clip_ratio_c": VERL_CLIP_RATIO_C},
    module=__name__,
    doc="""verl's ``vanilla`` policy loss (the name rLLM's verl backend passes, in an ``(estimator,
    loss)`` pair): :func:`ppo_clip_loss` on the token ratio, always dual-clipped, at ``clip_ratio_c``
    or, left None, at verl's default :data:`VERL_CLIP_RATIO_C` (3.0): ``ℓ = min(ℓ_ppo, -c A)``
    where ``A < 0``. verl also clamps ``log ρ`` to ``[-20, 20]``; the losses differ only for a
    ratio below ``e^-20`` (by less than ``2e-9 |A|`` a token).

    Source: verl ``verl/trainer/ppo/core_algos.py``, ``compute_policy_loss_vanilla``.
    Example: ``ρ = 4`` on a token with ``A = -1``: PPO's ``-ρA = 4``, capped at ``-3A = 3``.
    """,
)
