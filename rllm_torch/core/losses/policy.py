"""Policy losses on token tensors (pure functions: tensors and numbers in, tensors out).

Shared notation. ``N`` sequences, ``T`` tokens; every tensor argument is ``[N, T]`` float on one
device: ``log_probs`` (log π_θ of each token, with gradient), ``old_log_probs`` (log π_old, the
policy before the update; no gradient), ``advantages`` (A, one value per token: the trajectory
advantage times the response mask, or a precomputed per-token value), ``response_mask`` (1 on
trained tokens). ``ρ = exp(log π_θ - log π_old)`` is the importance ratio and ``sg`` stops the
gradient. Each function builds the per-token loss ``ℓ[n, t]`` below and reduces it with
:func:`~rllm_torch.core.losses.aggregation.aggregate_loss` (``loss_agg_mode``,
``horizon``), and returns ``(loss, stats)``: the scalar and a dict of detached 0-d diagnostics
(token means over the mask). On-policy (ρ = 1) every loss has the gradient ``-A ∇ log π``.
``normaliser`` (optional) is the token or sequence count the aggregation divides by, for a
data-parallel rank the global one (:func:`~rllm_torch.core.losses.aggregation.loss_normaliser`).
The ratio losses (``ppo``, ``importance_sampling``, ``cispo``) take ``importance_sampling_level``:
``"token"`` (ρ per token) or ``"sequence"`` (GSPO's length-normalised sequence ratio, one ρ per
row: :func:`~rllm_torch.core.losses.ratio.log_importance_ratio`). PPO and GSPO live in
:mod:`~rllm_torch.core.losses.ppo`, the other losses of :data:`POLICY_LOSSES` in their modules.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.losses.aggregation import aggregate_loss, token_mean
from rllm_torch.core.losses.covariance import clip_cov_loss, kl_cov_loss
from rllm_torch.core.losses.ppo import gspo_loss, ppo_clip_loss, vanilla_loss
from rllm_torch.core.losses.ratio import IMPORTANCE_SAMPLING_LEVELS, approx_kl, log_importance_ratio
from rllm_torch.core.losses.sequence import geo_mean_loss, luspo_loss
from rllm_torch.core.losses.soft_gate import sapo_loss, vespo_loss
from rllm_torch.core.losses.trust_region import dppo_kl_loss, dppo_tv_loss

__all__ = [
    "LOSS_FNS",
    "POLICY_LOSSES",
    "loss_options",
    "ppo_clip_loss",  # defined in losses.ppo, listed here as before
    "importance_sampling_loss",
    "cispo_loss",
    "dro_loss",
    "cross_entropy_loss",
    "gspo_loss",
    "policy_loss",
    "loss_requirement",
    "PINNED_AGG_MODES",
]


def importance_sampling_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    importance_sampling_level: str = "token",
    loss_agg_mode: str = "token-mean",
    horizon: int | None = None,
    normaliser: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The unclipped importance-weighted policy gradient, negated: ``ℓ = -ρ A``.

    Source: tinker's ``importance_sampling`` loss (``-(exp(target_lp - sampling_lp) * A)``).
    On-policy its gradient is REINFORCE's ``-A ∇ log π`` (Williams 1992).
    """
    ratio_NT = log_importance_ratio(log_probs, old_log_probs, response_mask, importance_sampling_level).exp()
    loss = aggregate_loss(-ratio_NT * advantages, response_mask, loss_agg_mode, horizon=horizon, normaliser=normaliser)
    return loss, {"approx_kl": approx_kl(log_probs - old_log_probs, response_mask)}


def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    importance_sampling_level: str = "token",
    loss_agg_mode: str = "token-mean",
    horizon: int | None = None,
    normaliser: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO, negated: ``ℓ = -sg(clip(ρ, 1 - ε_low, 1 + ε_high)) · A · log π_θ``.

    The importance weight is clipped and detached, so no token's gradient is dropped (PPO's clip
    zeroes it); the gradient is ``-clip(ρ) A ∇ log π``. Stats: ``clip_fraction`` (share of
    tokens whose ρ was clipped) and ``approx_kl``.

    Source: MiniMax-M1, arXiv:2506.13585, eq. 4 (the paper sets ε_low large, i.e. no lower
    clip; here both bounds come from ``clip_ratio_low`` / ``clip_ratio_high``); tinker's ``cispo``.
    """
    log_ratio = log_importance_ratio(log_probs, old_log_probs, response_mask, importance_sampling_level)
    ratio = log_ratio.detach().exp()
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = aggregate_loss(
        -weight * advantages * log_probs, response_mask, loss_agg_mode, horizon=horizon, normaliser=normaliser
    )
    with torch.no_grad():
        clipped_NT = (weight != ratio).float().expand_as(log_probs)
        stats = {"clip_fraction": token_mean(clipped_NT, response_mask)}
    return loss, stats | {"approx_kl": approx_kl(log_probs - old_log_probs, response_mask)}


def dro_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    beta: float = 0.05,
    loss_agg_mode: str = "token-mean",
    horizon: int | None = None,
    normaliser: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Direct reward optimisation, negated: ``ℓ = -(A · log π_θ - ½ β (log π_θ - log π_old)²)``.

    The quadratic term keeps the policy near the sampler ``q = π_old`` (off-policy and offline
    RL); its gradient is ``-(A - β (log π_θ - log π_old)) ∇ log π_θ``. ``beta >= 0``.

    Source: Richemond et al. 2024, "Offline regularised RL for LLM alignment", arXiv:2405.19107;
    Kimi k1.5, arXiv:2501.12599; tinker's ``dro`` loss (default ``beta`` 0.05).
    """
    log_ratio_NT = log_probs - old_log_probs
    loss = aggregate_loss(
        -(advantages * log_probs - 0.5 * beta * log_ratio_NT.square()),
        response_mask,
        loss_agg_mode,
        horizon=horizon,
        normaliser=normaliser,
    )
    return loss, {"approx_kl": approx_kl(log_ratio_NT, response_mask)}


def cross_entropy_loss(
    log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    *,
    loss_agg_mode: str = "token-mean",
    horizon: int | None = None,
    normaliser: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Weighted negative log-likelihood: ``ℓ = -A · log π_θ``, the advantage as the token weight.

    With ``A = 1`` on the response tokens it is supervised fine-tuning; with precomputed
    per-token advantages it is a weighted SFT / distillation loss; with RL advantages its
    gradient is REINFORCE's. No ``old_log_probs``: it does not correct for off-policy samples.

    Source: tinker's ``cross_entropy`` loss (``-(weights * target_logprobs)``), with the
    advantage in the place of ``weights``.
    """
    loss = aggregate_loss(-advantages * log_probs, response_mask, loss_agg_mode, horizon=horizon, normaliser=normaliser)
    with torch.no_grad():
        stats = {"nll": token_mean(-log_probs, response_mask)}
    return loss, stats


#: Every policy loss by its ``rllm.algorithm.loss_fn`` name (the peers' names): the one list of loss names.
POLICY_LOSSES: dict[str, Callable[..., tuple[Tensor, dict[str, Tensor]]]] = {
    "ppo": ppo_clip_loss,
    "importance_sampling": importance_sampling_loss,
    "cispo": cispo_loss,
    "dro": dro_loss,
    "cross_entropy": cross_entropy_loss,
    "sapo": sapo_loss,
    "geo_mean": geo_mean_loss,
    "dppo_tv": dppo_tv_loss,
    "dppo_kl": dppo_kl_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
    "luspo": luspo_loss,
    "vespo": vespo_loss,
    "gspo": gspo_loss,
    "vanilla": vanilla_loss,  # verl's names, in rLLM's (estimator, loss) pairs
    "gpg": cross_entropy_loss,  # verl's compute_policy_loss_gpg: -A log π, aggregated: cross_entropy's loss
}
#: The losses of the log-likelihood alone (no old policy).
_LOG_LIKELIHOOD = ("cross_entropy", "gpg")
LOSS_FNS = tuple(POLICY_LOSSES)
#: Losses whose math needs one aggregation, whatever ``rllm.algorithm.loss_agg_mode`` says (rLLM's pins).
PINNED_AGG_MODES = {"gspo": "seq-mean-token-mean"}
#: Options that turn a feature on: given to a loss without the feature, a value other than this
#: one would be dropped silently, so it is refused instead. Other options a loss does not take
#: (another loss's tuning) are ignored.
_OFF = {"importance_sampling_level": "token", "clip_ratio_c": None, "delta": None}


#: What a loss requires of its settings (given the loss's keyword options), as a reason when they
#: do not hold: the start-up check of a run reads it, so the rule lives with the loss.
_REQUIREMENTS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "clip_cov": lambda o: (
        None
        if o["clip_cov_lb"] < o["clip_cov_ub"]
        else f"it cuts tokens whose covariance lies between clip_cov_lb and clip_cov_ub: clip_cov_lb={o['clip_cov_lb']} must be below clip_cov_ub={o['clip_cov_ub']}"
    ),
    "luspo": lambda o: (
        None
        if o["loss_agg_mode"] == "seq-mean-token-sum"
        else f"luspo weights each sequence's loss by its length (TRL's LUSPO): it needs loss_agg_mode=seq-mean-token-sum, not {o['loss_agg_mode']!r}"
    ),
    "dro": lambda o: (
        None
        if o.get("tis_mode") is None
        else "importance weights (rollout_correction.tis_mode) scale the advantage term, and DRO's quadratic term is "
        "not linear in it: use another loss_fn, or tis_mode=null"
    ),
}


def loss_requirement(name: str, options: dict[str, Any]) -> str | None:
    """Why the loss ``name`` cannot run with ``options`` (its keyword options: ``clip_cov_lb``,
    ``loss_agg_mode``, ..., and ``tis_mode``, rollout correction's weights), or None when it can."""
    check = _REQUIREMENTS.get(name)
    return check(options) if check is not None else None


@cache
def loss_options(name: str) -> frozenset[str]:
    """The keyword options of the loss ``name`` (its signature's keyword-only parameters).

    Raises:
        ValueError: ``name`` is not one of :data:`LOSS_FNS`.
    """
    if name not in POLICY_LOSSES:
        raise ValueError(f"loss {name!r} is not one of {LOSS_FNS}.")
    parameters = inspect.signature(POLICY_LOSSES[name]).parameters.values()
    return frozenset(p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY)


def policy_loss(
    name: str,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    **options: Any,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The loss ``name`` (one of :data:`LOSS_FNS`), given the options its signature takes.

    ``options`` may hold any loss's options (``clip_ratio_low``, ``beta``, ``loss_agg_mode``,
    ...): each loss receives those it declares and ignores another loss's tuning; an option
    that switches a feature on (``importance_sampling_level="sequence"``, ``clip_ratio_c``)
    given to a loss without that feature is refused. ``cross_entropy`` takes no
    ``old_log_probs``.

    Raises:
        ValueError: an unknown loss name, aggregation mode or ``importance_sampling_level``;
            ``importance_sampling_level="sequence"`` or ``clip_ratio_c`` with a loss that has no
            such ratio or clip (``dro``, ``cross_entropy``; ``clip_ratio_c``: ``ppo`` only).
        TypeError: an option no loss takes.

    Example (one token, on-policy, log π = -1, A = 2: ``-ρA = -2`` for the ratio losses,
    ``-A log π = 2`` for the log-likelihood ones):
        >>> import torch
        >>> logp, adv, mask = torch.tensor([[-1.0]]), torch.tensor([[2.0]]), torch.tensor([[1.0]])
        >>> [policy_loss(name, logp, logp, adv, mask)[0].item() for name in LOSS_FNS[:5]]
        [-2.0, -2.0, 2.0, 2.0, 2.0]
    """
    takes = loss_options(name)
    known = frozenset().union(*map(loss_options, LOSS_FNS))
    if unknown := sorted(set(options) - known):
        raise TypeError(f"policy_loss got options no loss takes: {unknown}; the losses take {sorted(known)}.")
    level = options.get("importance_sampling_level", "token")
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        log_importance_ratio(log_probs, old_log_probs, response_mask, level)  # raises, naming the levels
    for option, off in _OFF.items():
        if option not in takes and options.get(option, off) != off:
            takers = ", ".join(repr(n) for n in LOSS_FNS if option in loss_options(n))
            raise ValueError(
                f"{option}={options[option]!r}: loss {name!r} has none; it applies to {takers} only "
                f"(leave it at {off!r}, or use one of those losses)."
            )
    chosen = {k: v for k, v in options.items() if k in takes}
    if name in _LOG_LIKELIHOOD:  # a log-likelihood loss: no old policy
        return cross_entropy_loss(log_probs, advantages, response_mask, **chosen)
    return POLICY_LOSSES[name](log_probs, old_log_probs, advantages, response_mask, **chosen)
