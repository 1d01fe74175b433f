"""Policy losses on token tensors (pure functions: tensors and numbers in, tensors out).

Shared notation. ``N`` sequences, ``T`` tokens; every tensor argument is ``[N, T]`` float on one
device: ``log_probs`` (log π_θ of each token, with gradient), ``old_log_probs`` (log π_old, the
policy before the update; no gradient), ``advantages`` (A, one value per token: the trajectory
advantage times the response mask, or a precomputed per-token value), ``response_mask`` (1 on
trained tokens). ``ρ = exp(log π_θ - log π_old)`` is the importance ratio and ``sg`` stops the
gradient. Every built-in loss has one signature, ``fn(log_probs, old_log_probs, advantages,
response_mask, *, agg, **options)``: it builds the per-token loss ``ℓ[n, t]`` below and reduces
it with ``agg``, an :class:`~rllm_torch.core.losses.aggregation.Aggregation` (the mode, Dr. GRPO's
horizon and the count it divides by, for a data-parallel rank the global one; default: the
token mean over the call's mask), and returns ``(loss, stats)``: the scalar and a dict of
detached 0-d diagnostics (token means over the mask). On-policy (ρ = 1) every loss has the
gradient ``-A ∇ log π``. Each loss is declared once, beside its function
(:class:`~rllm_torch.core.losses.declaration.BuiltinLoss`: its name, the run setting of each of
its options, what it pins and requires); :data:`POLICY_LOSSES` lists the declarations.
The ratio losses (``ppo``, ``importance_sampling``, ``cispo``) take ``importance_sampling_level``:
``"token"`` (ρ per token) or ``"sequence"`` (GSPO's length-normalised sequence ratio, one ρ per
row: :func:`~rllm_torch.core.losses.ratio.log_importance_ratio`). PPO and GSPO live in
:mod:`~rllm_torch.core.losses.ppo`, the other losses of :data:`POLICY_LOSSES` in their modules.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.losses.aggregation import Aggregation, token_mean
from rllm_torch.core.losses.context import LossContext, LossOutput
from rllm_torch.core.losses.covariance import clip_cov_loss, kl_cov_loss
from rllm_torch.core.losses.declaration import CLIP, LEVEL, BuiltinLoss, builtin_loss
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


def _dro_without_weights(options: dict[str, Any]) -> str | None:
    if options.get("tis_mode") is None:
        return None
    return (
        "importance weights (rollout_correction.tis_mode) scale the advantage term, and DRO's quadratic term is "
        "not linear in it: use another loss_fn, or tis_mode=null"
    )


@builtin_loss("importance_sampling", LEVEL)
def importance_sampling_loss(ctx: LossContext, *, importance_sampling_level: str = "token") -> LossOutput:
    """The unclipped importance-weighted policy gradient, negated: ``ℓ = -ρ A``.

    Source: tinker's ``importance_sampling`` loss (``-(exp(target_lp - sampling_lp) * A)``).
    On-policy its gradient is REINFORCE's ``-A ∇ log π`` (Williams 1992).
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    ratio_NT = log_importance_ratio(log_probs, old_log_probs, response_mask, importance_sampling_level).exp()
    loss = ctx.aggregate(-ratio_NT * advantages, response_mask)
    return loss, {"approx_kl": approx_kl(log_probs - old_log_probs, response_mask)}


@builtin_loss("cispo", CLIP | LEVEL)
def cispo_loss(
    ctx: LossContext,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    importance_sampling_level: str = "token",
) -> LossOutput:
    """CISPO, negated: ``ℓ = -sg(clip(ρ, 1 - ε_low, 1 + ε_high)) · A · log π_θ``.

    The importance weight is clipped and detached, so no token's gradient is dropped (PPO's clip
    zeroes it); the gradient is ``-clip(ρ) A ∇ log π``. Stats: ``clip_fraction`` (share of
    tokens whose ρ was clipped) and ``approx_kl``.

    Source: MiniMax-M1, arXiv:2506.13585, eq. 4 (the paper sets ε_low large, i.e. no lower
    clip; here both bounds come from ``clip_ratio_low`` / ``clip_ratio_high``); tinker's ``cispo``.
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    log_ratio = log_importance_ratio(log_probs, old_log_probs, response_mask, importance_sampling_level)
    ratio = log_ratio.detach().exp()
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = ctx.aggregate(-weight * advantages * log_probs, response_mask)
    with torch.no_grad():
        clipped_NT = (weight != ratio).float().expand_as(log_probs)
        stats = {"clip_fraction": token_mean(clipped_NT, response_mask)}
    return loss, stats | {"approx_kl": approx_kl(log_probs - old_log_probs, response_mask)}


@builtin_loss("dro", {"beta": "backend.dro_beta"}, requirement=_dro_without_weights)
def dro_loss(ctx: LossContext, *, beta: float = 0.05) -> LossOutput:
    """Direct reward optimisation, negated: ``ℓ = -(A · log π_θ - ½ β (log π_θ - log π_old)²)``.

    The quadratic term keeps the policy near the sampler ``q = π_old`` (off-policy and offline
    RL); its gradient is ``-(A - β (log π_θ - log π_old)) ∇ log π_θ``. ``beta >= 0``.

    Source: Richemond et al. 2024, "Offline regularised RL for LLM alignment", arXiv:2405.19107;
    Kimi k1.5, arXiv:2501.12599; tinker's ``dro`` loss (default ``beta`` 0.05).
    """
    log_probs, old_log_probs, advantages, response_mask = ctx.logp_curr, ctx.logp_old, ctx.advantages, ctx.action_mask
    log_ratio_NT = log_probs - old_log_probs
    loss = ctx.aggregate(-(advantages * log_probs - 0.5 * beta * log_ratio_NT.square()), response_mask)
    return loss, {"approx_kl": approx_kl(log_ratio_NT, response_mask)}


@builtin_loss("cross_entropy", {}, old_policy=False)
def cross_entropy_loss(ctx: LossContext) -> LossOutput:
    """Weighted negative log-likelihood: ``ℓ = -A · log π_θ``, the advantage as the token weight.

    With ``A = 1`` on the response tokens it is supervised fine-tuning; with precomputed
    per-token advantages it is a weighted SFT / distillation loss; with RL advantages its
    gradient is REINFORCE's. No ``old_log_probs`` (called on tensors without them): it does not
    correct for off-policy samples.

    Source: tinker's ``cross_entropy`` loss (``-(weights * target_logprobs)``), with the
    advantage in the place of ``weights``.
    """
    log_probs, advantages, response_mask = ctx.logp_curr, ctx.advantages, ctx.action_mask
    loss = ctx.aggregate(-advantages * log_probs, response_mask)
    with torch.no_grad():
        stats = {"nll": token_mean(-log_probs, response_mask)}
    return loss, stats


#: verl's ``compute_policy_loss_gpg``: ``-A log π``, aggregated: cross_entropy's loss under verl's name.
_GPG = BuiltinLoss("gpg", cross_entropy_loss.fn, {}, old_policy=False)

#: Every built-in policy loss by its ``rllm.algorithm.loss_fn`` name (the peers' names; ``vanilla``
#: and ``gpg`` verl's, in rLLM's (estimator, loss) pairs): the one list of loss names, each a
#: :class:`~rllm_torch.core.losses.declaration.BuiltinLoss`, called like its function.
POLICY_LOSSES: dict[str, BuiltinLoss] = {
    loss.name: loss
    for loss in (ppo_clip_loss, importance_sampling_loss, cispo_loss, dro_loss, cross_entropy_loss, sapo_loss)
    + (geo_mean_loss, dppo_tv_loss, dppo_kl_loss, clip_cov_loss, kl_cov_loss, luspo_loss, vespo_loss, gspo_loss)
    + (vanilla_loss, _GPG)
}
LOSS_FNS = tuple(POLICY_LOSSES)
#: Losses whose math needs one aggregation: the update aggregates them in it whatever
#: ``rllm.algorithm.loss_agg_mode`` says (rLLM's pin of ``gspo``); ``luspo`` also refuses a run in another.
PINNED_AGG_MODES = {name: loss.agg_mode for name, loss in POLICY_LOSSES.items() if loss.agg_mode is not None}
#: Options that turn a feature on: given to a loss without the feature, a value other than this
#: one would be dropped silently, so it is refused instead. Other options a loss does not take
#: (another loss's tuning) are ignored.
_OFF = {"importance_sampling_level": "token", "clip_ratio_c": None, "delta": None}
_AGGREGATION = ("loss_agg_mode", "horizon", "normaliser")


def _declared(name: str) -> BuiltinLoss:
    if name not in POLICY_LOSSES:
        raise ValueError(f"loss {name!r} is not one of {LOSS_FNS}.")
    return POLICY_LOSSES[name]


def loss_requirement(name: str, options: dict[str, Any]) -> str | None:
    """Why the loss ``name`` cannot run with ``options`` (its keyword options: ``clip_cov_lb``,
    ..., ``loss_agg_mode``, and ``tis_mode``, rollout correction's weights), or None when it can
    (or is not built in): its declaration's ``requirement``, which the start-up check of a run reads."""
    loss = POLICY_LOSSES.get(name)
    return loss.why_not(options) if loss is not None else None


def loss_options(name: str) -> frozenset[str]:
    """The options of the loss ``name`` (those its declaration reads from run settings; the
    aggregation is not one).

    Raises:
        ValueError: ``name`` is not one of :data:`LOSS_FNS`.
    """
    return _declared(name).options


_ALL_OPTIONS = frozenset().union(*(loss.options for loss in POLICY_LOSSES.values()), _AGGREGATION)


def policy_loss(
    name: str, log_probs: Tensor, old_log_probs: Tensor, advantages: Tensor, response_mask: Tensor, **options: Any
) -> LossOutput:
    """The loss ``name`` (one of :data:`LOSS_FNS`), given the options it takes.

    ``options`` may hold any loss's options (``clip_ratio_low``, ``beta``, ...) and the aggregation
    (``loss_agg_mode``, default the loss's pinned mode or ``token-mean``; ``horizon``;
    ``normaliser``), made into the loss's :class:`~rllm_torch.core.losses.aggregation.Aggregation`:
    each loss receives those it declares and ignores another loss's tuning; an option that
    switches a feature on (``importance_sampling_level="sequence"``, ``clip_ratio_c``) given to
    a loss without that feature is refused. ``cross_entropy`` ignores ``old_log_probs``.

    Raises:
        ValueError: an unknown loss name, aggregation mode or ``importance_sampling_level``;
            ``importance_sampling_level="sequence"`` or ``clip_ratio_c`` with a loss that has no
            such ratio or clip (``dro``, ``cross_entropy``; ``clip_ratio_c``: ``ppo`` only);
            options the loss cannot run with (``luspo`` in another mode than its own).
        TypeError: an option no loss takes.

    Example (one token, on-policy, log π = -1, A = 2: ``-ρA = -2`` for the ratio losses,
    ``-A log π = 2`` for the log-likelihood ones):
        >>> import torch
        >>> logp, adv, mask = torch.tensor([[-1.0]]), torch.tensor([[2.0]]), torch.tensor([[1.0]])
        >>> [policy_loss(name, logp, logp, adv, mask)[0].item() for name in LOSS_FNS[:5]]
        [-2.0, -2.0, 2.0, 2.0, 2.0]
    """
    loss = _declared(name)
    if unknown := sorted(set(options) - _ALL_OPTIONS):
        raise TypeError(f"policy_loss got options no loss takes: {unknown}; the losses take {sorted(_ALL_OPTIONS)}.")
    level = options.get("importance_sampling_level", "token")
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        log_importance_ratio(log_probs, old_log_probs, response_mask, level)  # raises, naming the levels
    for option, off in _OFF.items():
        if option not in loss.options and options.get(option, off) != off:
            takers = ", ".join(repr(n) for n in LOSS_FNS if option in loss_options(n))
            raise ValueError(
                f"{option}={options[option]!r}: loss {name!r} has none; it applies to {takers} only "
                f"(leave it at {off!r}, or use one of those losses)."
            )
    ctx = LossContext(
        logp_curr=log_probs,
        logp_old=old_log_probs,
        advantages=advantages,
        action_mask=response_mask,
        obs_mask=torch.zeros_like(response_mask),
        aggregate=Aggregation(
            options.get("loss_agg_mode", loss.agg_mode or "token-mean"),
            options.get("horizon"),
            options.get("normaliser"),
        ),
        params={k: v for k, v in options.items() if k in loss.options},
    )
    return loss.compute(ctx)
