"""rLLM's ``echo`` loss (branch ``terminal-rl``, ``rllm/trainer/algorithms/loss.py``): PPO's clipped
surrogate on the action tokens plus a cross-entropy term on the environment-observation tokens,
registered as rLLM registers it, so that it reads its parameters from ``rllm.algorithm.loss_params``
(``env_loss_coef``) and rLLM's ``eps_clip`` / ``eps_clip_high`` (``backend.clip_ratio_low`` /
``clip_ratio_high``).

Its observation tokens are the tokens a multi-turn workflow's environment added to the conversation
between two of the policy's turns (``TokenBatch.obs_mask``): in a step's row, the prompt tokens
after the previous step's prompt and response. A single-turn step has none, and its loss is
PPO's. ``needs=("obs_mask",)`` makes the trainer pack them and score them in the update.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rllm_torch.core.losses.context import LossContext
from rllm_torch.core.losses.ratio import clipped_surrogate
from rllm_torch.core.losses.registry import register_loss

__all__ = ["echo_loss", "ECHO_ENV_LOSS_COEF"]

#: ``env_loss_coef`` when ``loss_params`` does not set it (rLLM's default, the paper's value).
ECHO_ENV_LOSS_COEF = 0.05
#: rLLM clamps ``log ρ`` to this before the exponential (its ``_RATIO_CLAMP``).
_LOG_RATIO_CLAMP = 20.0


@register_loss("echo", needs=("obs_mask",))
def echo_loss(ctx: LossContext) -> tuple[Tensor, dict[str, float]]:
    """ECHO: ``ℓ = ℓ_PPO(action tokens) + c · agg(-log π_θ(o), observation tokens)``.

    ``ℓ_PPO = -min(ρ A, clip(ρ, 1 - ε, 1 + ε_high) A)`` with ``ρ = exp(clamp(log π_θ - log π_old,
    ±20))``, aggregated over ``ctx.action_mask``; the second term is the negative log-likelihood
    of the observation tokens (``ctx.obs_mask``), aggregated by the same ``ctx.aggregate`` (so
    normalised, for ``token-mean``, by the step's action tokens, as rLLM's verl backend does).
    ``c = env_loss_coef`` (``ctx.params``, default :data:`ECHO_ENV_LOSS_COEF`); ``c = 0`` gives
    rLLM's ``ppo_clip`` exactly.

    Metrics: ``ppo/clip_frac`` (share of action tokens whose ratio is outside the clip range) and,
    with ``c != 0``, ``echo/coef``.

    Source: ECHO, arXiv:2605.24517; the formula and defaults of rLLM's ``echo`` and ``ppo_clip``
    (rllm-org/rllm, branch ``terminal-rl`` a5fa9aa1).
    """
    eps = float(ctx.params.get("eps_clip", 0.2))
    eps_high = ctx.params.get("eps_clip_high")
    eps_high = eps if eps_high is None else float(eps_high)
    ratio = torch.exp(torch.clamp(ctx.logp_curr - ctx.logp_old, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    pg, _ = clipped_surrogate(ratio, ctx.advantages, clip_ratio_low=eps, clip_ratio_high=eps_high)
    action = ctx.action_mask
    outside = ((ratio < 1.0 - eps) | (ratio > 1.0 + eps_high)).to(action.dtype)
    loss = ctx.aggregate(pg, action)
    metrics = {"ppo/clip_frac": float((outside * action).sum() / action.sum().clamp(min=1.0))}
    coef = float(ctx.params.get("env_loss_coef", ECHO_ENV_LOSS_COEF))
    if coef:
        loss = loss + coef * ctx.aggregate(-ctx.logp_curr, ctx.obs_mask)
        metrics["echo/coef"] = coef
    return loss, metrics
