"""A registry of policy losses written by users (rLLM's ``register_loss``, from its
``terminal-rl`` branch): a loss is a function of a :class:`LossContext` returning ``(loss,
metrics)``, registered under a name that ``rllm.algorithm.loss_fn`` (or a role's entry of
``loss_fn_map`` / ``estimator_map``) selects, next to the built-in losses of
:mod:`~rllm_torch.core.losses.policy`.

Example (``rllm-torch-train imports=[my_losses] rllm.algorithm.loss_fn=clipped_pg``)::

    from rllm_torch import LossContext, register_loss

    @register_loss("clipped_pg")
    def clipped_pg(ctx: LossContext):
        ratio = (ctx.logp_curr - ctx.logp_old).exp()
        weight = ratio.clamp(max=1 + ctx.params.get("eps_clip", 0.2)).detach()
        return ctx.aggregate(-ctx.advantages * weight * ctx.logp_curr, ctx.action_mask), {}
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.errors import ConfigError
from rllm_torch.core.losses.aggregation import AGG_MODES
from rllm_torch.core.losses.policy import LOSS_FNS

__all__ = [
    "LossContext",
    "LossFn",
    "RegisteredLoss",
    "register_loss",
    "registered_loss",
    "loss_names",
    "losses_need",
    "check_registered_loss",
    "run_registered_loss",
    "LOSS_INPUTS",
]

#: The tensors a registered loss may declare it needs beyond the always-present ones
#: (``logp_curr``, ``logp_old``, ``advantages``, ``action_mask``): the trainer provides them.
LOSS_INPUTS = ("logp_ref", "logp_rollout")


@dataclass
class LossContext:
    """What a registered loss sees (rLLM's ``LossContext``). Every tensor is ``[R, T]`` float on
    the batch's device: ``R`` rows (one per step) of a micro-batch, ``T`` response tokens.

    Attributes:
        logp_curr: log π_θ of each token, the only input with a gradient.
        logp_old: log π_old (the ratio's denominator; the rollout's under ``bypass_mode``), detached.
        advantages: the per-token advantages (after the rollout correction's weights, if any).
        action_mask: 1.0 on the tokens this loss trains (the role's rows, less the filtered tokens).
        obs_mask: 1.0 on environment-observation tokens: none here (observations are prompt
            tokens, never response tokens), so all zeros.
        aggregate: ``aggregate(per_token [R, T], mask [R, T], mode=None) -> 0-d``: the run's
            ``loss_agg_mode`` (or ``mode``, or the loss's pinned one) over the *global*
            mini-batch, as the built-in losses aggregate.
        logp_ref: the reference policy's log-probs (a loss that declares ``needs=("logp_ref",)``
            gets them), else None.
        logp_rollout: the sampler's log-probs.
        params: ``rllm.algorithm.loss_params``, with rLLM's ``eps_clip``, ``eps_clip_high``
            (the run's ``backend.clip_ratio_low`` / ``_high``) and ``kl_beta`` (0).
        backend: ``"torch"``.
    """

    logp_curr: Tensor
    logp_old: Tensor
    advantages: Tensor
    action_mask: Tensor
    obs_mask: Tensor
    aggregate: Callable[..., Tensor]
    logp_ref: Tensor | None = None
    logp_rollout: Tensor | None = None
    params: dict[str, Any] = field(default_factory=dict)
    backend: str = "torch"

    def seq_reduce(self, values: Tensor, mask: Tensor, reduction: str = "mean") -> Tensor:
        """Each row's masked mean (``reduction="mean"``) or sum of ``values``, broadcast back to
        ``[R, T]`` (sequence-level losses such as GSPO's)."""
        summed = (values * mask).sum(dim=-1, keepdim=True)
        if reduction == "mean":
            summed = summed / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
        return summed.expand_as(values)


LossFn = Callable[[LossContext], "tuple[Tensor, dict[str, float]]"]


@dataclass(frozen=True)
class RegisteredLoss:
    """One registered loss: its function, the aggregation it pins (None: the run's) and the
    inputs it needs (:data:`LOSS_INPUTS`)."""

    fn: LossFn
    agg_mode: str | None
    needs: frozenset[str]


_LOSSES: dict[str, RegisteredLoss] = {}


def register_loss(name: str, *, agg_mode: str | None = None, needs: Iterable[str] = ()) -> Callable[[LossFn], LossFn]:
    """Decorator registering a policy loss under ``name`` (rLLM's ``register_loss``).

    The function takes a :class:`LossContext` and returns ``(loss, metrics)``: a 0-d tensor with
    a gradient through ``ctx.logp_curr``, and a dict of floats (or 0-d tensors) logged as
    ``actor/<key>``, averaged over the trained tokens of the step.

    Args:
        name: the name ``rllm.algorithm.loss_fn`` (or a role's ``loss_fn_map`` entry) selects.
        agg_mode: pin the aggregation (one of :data:`~rllm_torch.core.losses.AGG_MODES`), for a
            loss whose math needs one (GSPO's ``seq-mean-token-mean``); None: the run's.
        needs: the inputs of :data:`LOSS_INPUTS` it reads (``"logp_ref"`` makes the trainer keep
            a reference policy).

    Registering a name again replaces the earlier function, with a ``UserWarning``.

    Raises:
        ConfigError: ``name`` is a built-in loss, not a non-empty str, or ``agg_mode`` / ``needs``
            name something unknown.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"register_loss needs a non-empty name, e.g. @register_loss('my_loss'); got {name!r}.")
    if name in LOSS_FNS:
        raise ConfigError(f"loss {name!r} is built in ({', '.join(LOSS_FNS)}); register yours under another name.")
    if agg_mode is not None and agg_mode not in AGG_MODES:
        raise ConfigError(f"register_loss({name!r}): agg_mode={agg_mode!r} is not one of {AGG_MODES}.")
    needs = frozenset(needs)
    if unknown := sorted(needs - set(LOSS_INPUTS)):
        raise ConfigError(f"register_loss({name!r}): needs {unknown} are not inputs a loss can ask for: {LOSS_INPUTS}.")

    def decorator(fn: LossFn) -> LossFn:
        if not callable(fn):
            raise ConfigError(f"loss {name!r} must be callable, got {type(fn).__name__}.")
        if name in _LOSSES and _LOSSES[name].fn is not fn:
            warnings.warn(
                f"loss {name!r} is registered again: the new function replaces the old.", UserWarning, stacklevel=2
            )
        _LOSSES[name] = RegisteredLoss(fn, agg_mode, needs)
        return fn

    return decorator


def registered_loss(name: str) -> RegisteredLoss | None:
    """The registered (user) loss ``name``, or None (a built-in, or not a loss at all)."""
    return _LOSSES.get(name)


def losses_need(names: Iterable[str], name: str) -> bool:
    """Whether one of the losses ``names`` is registered as needing the input ``name`` (:data:`LOSS_INPUTS`)."""
    return any((loss := _LOSSES.get(n)) is not None and name in loss.needs for n in names)


def loss_names() -> tuple[str, ...]:
    """Every loss name a run may select: the built-ins, then the registered ones (sorted)."""
    return (*LOSS_FNS, *sorted(_LOSSES))


def run_registered_loss(
    name: str,
    loss: RegisteredLoss,
    logp_curr: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    logp_rollout: Tensor | None,
    logp_ref: Tensor | None,
    aggregate: Callable[..., Tensor],
    params: dict[str, Any],
) -> tuple[Tensor, dict[str, Tensor]]:
    """The registered loss ``name`` on one micro-batch's ``[R, T]`` tensors (see :class:`LossContext`):
    ``(loss, metrics)``, its metrics as detached float32 0-d tensors keyed by the loss's own key
    when it has a ``/`` (rLLM's ``"icepop/mask_frac"``), else ``"{name}/{key}"``.

    Raises:
        ConfigError: the loss returned something other than ``(0-d tensor, dict)``.
    """
    ctx = LossContext(
        logp_curr=logp_curr,
        logp_old=logp_old,
        advantages=advantages,
        action_mask=action_mask,
        obs_mask=torch.zeros_like(action_mask),
        aggregate=aggregate,
        logp_ref=logp_ref,
        logp_rollout=logp_rollout,
        params=params,
    )
    out = loss.fn(ctx)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], Tensor) and isinstance(out[1], dict)):
        raise ConfigError(
            f"loss {name!r} must return (loss, metrics), a 0-d tensor and a dict; got {type(out).__name__}."
        )
    metrics = {
        (k if "/" in k else f"{name}/{k}"): torch.as_tensor(v, dtype=torch.float32).detach() for k, v in out[1].items()
    }
    return out[0], metrics


def check_registered_loss(name: str, fn: LossFn) -> None:
    """Run the registered loss ``name`` once on a small synthetic batch (two rows of three tokens,
    one token masked) so a loss that cannot train stops the run at start-up.

    Raises:
        ConfigError: it raised, returned something other than ``(0-d tensor, dict)``, a loss
            without a gradient through ``logp_curr`` or a non-finite one; the message names it.
    """
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.4], [0.3, 0.6, 0.9]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])

    def aggregate(per_token: Tensor, m: Tensor, mode: str | None = None) -> Tensor:
        return (per_token * m).sum() / m.sum().clamp(min=1.0)

    ctx = LossContext(
        logp_curr=logp,
        logp_old=logp.detach() - 0.05,
        advantages=torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]),
        action_mask=mask,
        obs_mask=torch.zeros_like(mask),
        aggregate=aggregate,
        logp_ref=logp.detach() + 0.05,
        logp_rollout=logp.detach() - 0.05,
        params={"eps_clip": 0.2, "eps_clip_high": 0.2, "kl_beta": 0.0},
    )
    where = f"loss {name!r} ({getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)})"
    try:
        out = fn(ctx)
    except Exception as exc:  # noqa: BLE001 - any failure of user code stops the run with its message
        raise ConfigError(f"{where} fails on a small batch: {type(exc).__name__}: {exc}") from exc
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise ConfigError(f"{where} must return (loss, metrics), a 0-d tensor and a dict; got {type(out).__name__}.")
    loss = out[0]
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        raise ConfigError(f"{where} must return a 0-d tensor as its loss, got {loss!r:.80}.")
    if not loss.requires_grad:
        raise ConfigError(f"{where} returned a loss without a gradient: it must depend on ctx.logp_curr.")
    if not bool(torch.isfinite(loss)):
        raise ConfigError(f"{where} returned a non-finite loss ({loss.item()}) on a small well-formed batch.")
