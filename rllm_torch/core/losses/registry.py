"""A registry of policy losses written by users (rLLM's ``register_loss``, from its
``terminal-rl`` branch): a loss is a function of a :class:`LossContext` returning ``(loss,
metrics)``, registered under a name that ``rllm.algorithm.loss_fn`` (or a role's entry of
``loss_fn_map`` / ``estimator_map``) selects, next to the built-in losses of
:mod:`~rllm_torch.core.losses.policy`. :func:`resolve_loss` finds either kind by name; both are
called by the update in one way (``compute(ctx)``, ``params(setting, loss_params)``).

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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rllm_torch.core.errors import ConfigError, LossDeclarationError
from rllm_torch.core.losses.aggregation import AGG_MODES, Aggregation
from rllm_torch.core.losses.context import LossContext
from rllm_torch.core.losses.declaration import CLIP, BuiltinLoss
from rllm_torch.core.losses.policy import LOSS_FNS, POLICY_LOSSES

__all__ = [
    "LossContext",
    "LossFn",
    "RegisteredLoss",
    "register_loss",
    "registered_loss",
    "resolve_loss",
    "loss_names",
    "losses_need",
    "check_registered_loss",
    "check_loss_settings",
    "LOSS_INPUTS",
    "RLLM_PARAMS",
]

#: The tensors a registered loss may declare it needs beyond the always-present ones
#: (``logp_curr``, ``logp_old``, ``advantages``, ``action_mask``): the trainer provides them.
#: ``obs_mask``: the environment-observation tokens of multi-turn steps, packed and scored
#: (``ctx.logp_curr`` holds their log-probs; without it ``ctx.obs_mask`` is all zeros).
LOSS_INPUTS = ("logp_ref", "logp_rollout", "obs_mask")
#: rLLM's parameters of every registered loss (``LossContext.params``), each read from a run
#: setting: PPO's clip range as ``eps_clip`` / ``eps_clip_high``.
RLLM_PARAMS = {"eps_clip": CLIP["clip_ratio_low"], "eps_clip_high": CLIP["clip_ratio_high"]}

LossFn = Callable[[LossContext], "tuple[Tensor, dict[str, float]]"]


@dataclass(frozen=True)
class RegisteredLoss:
    """One registered loss: its name, its function, the aggregation it pins (None: the run's)
    and the inputs it needs (:data:`LOSS_INPUTS`)."""

    name: str
    fn: LossFn
    agg_mode: str | None
    needs: frozenset[str]

    def params(self, setting: Callable[[str], Any], loss_params: Mapping[str, Any]) -> dict[str, Any]:
        """rLLM's ``LossContext.params``: :data:`RLLM_PARAMS` read from the run's settings, ``kl_beta``
        0 (the KL loss is the trainer's, ``use_kl_loss``), then ``loss_params`` (the user's)."""
        rllm = {param: setting(key) for param, key in RLLM_PARAMS.items()}
        return rllm | {"kl_beta": 0.0} | dict(loss_params)

    def compute(self, ctx: LossContext) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss on ``ctx``: ``(loss, metrics)``, its metrics as detached float32 0-d tensors
        keyed by the loss's own key when it has a ``/`` (rLLM's ``"icepop/mask_frac"``), else
        ``"{name}/{key}"``.

        Raises:
            ConfigError: the loss returned something other than ``(0-d tensor, dict)``.
        """
        loss, metrics = _checked(f"loss {self.name!r}", self.fn(ctx))
        return loss, {
            (k if "/" in k else f"{self.name}/{k}"): torch.as_tensor(v, dtype=torch.float32).detach()
            for k, v in metrics.items()
        }


def _checked(where: str, out: object) -> tuple[Tensor, dict]:
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise ConfigError(f"{where} must return (loss, metrics), a 0-d tensor and a dict; got {type(out).__name__}.")
    if not isinstance(out[0], Tensor) or out[0].dim() != 0:
        raise ConfigError(f"{where} must return a 0-d tensor as its loss, got {out[0]!r:.80}.")
    return out


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
        _LOSSES[name] = RegisteredLoss(name, fn, agg_mode, needs)
        return fn

    return decorator


def registered_loss(name: str) -> RegisteredLoss | None:
    """The registered (user) loss ``name``, or None (a built-in, or not a loss at all)."""
    return _LOSSES.get(name)


def resolve_loss(name: str) -> BuiltinLoss | RegisteredLoss:
    """The loss ``name``: a built-in's declaration, or a registered loss.

    Raises:
        ConfigError: no loss has that name (the message lists those that do).
    """
    loss = POLICY_LOSSES.get(name) or _LOSSES.get(name)
    if loss is None:
        raise ConfigError(f"policy loss {name!r} is neither built in nor registered; the losses: {loss_names()}.")
    return loss


def losses_need(names: Iterable[str], name: str) -> bool:
    """Whether one of the losses ``names`` is registered as needing the input ``name`` (:data:`LOSS_INPUTS`)."""
    return any((loss := _LOSSES.get(n)) is not None and name in loss.needs for n in names)


def loss_names() -> tuple[str, ...]:
    """Every loss name a run may select: the built-ins, then the registered ones (sorted)."""
    return (*LOSS_FNS, *sorted(_LOSSES))


def check_loss_settings(is_setting: Callable[[str], bool]) -> None:
    """Refuse a loss option read from a setting the run does not have: each built-in loss's
    declared settings and :data:`RLLM_PARAMS`, against ``is_setting`` (the run's schema: whether
    a dotted key such as ``"backend.tau_pos"`` is one of its settings). The backend that reads
    them calls it when it is imported.

    Raises:
        LossDeclarationError: naming the loss, the option, the setting and where to declare it.
    """
    declared = [(loss.name, loss.settings, loss.fn.__module__) for loss in POLICY_LOSSES.values()]
    for name, settings, module in [*declared, ("(every registered loss)", RLLM_PARAMS, __name__)]:
        for option, key in settings.items():
            if key is not None and not is_setting(key):
                raise LossDeclarationError(
                    f"loss {name!r}: option {option!r} is read from the setting {key!r}, which the run's schema does "
                    f"not have. Declare {key} (a backend.* setting in rllm_torch/trainer/backend_schema.py, "
                    f"BackendConfig), or map {option!r} to an existing setting in the loss's declaration ({module})."
                )


def check_registered_loss(name: str, fn: LossFn) -> None:
    """Run the registered loss ``name`` once on a small synthetic batch (two rows of three tokens,
    one token masked) so a loss that cannot train stops the run at start-up.

    Raises:
        ConfigError: it raised, returned something other than ``(0-d tensor, dict)``, a loss
            without a gradient through ``logp_curr`` or a non-finite one; the message names it.
    """
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.4], [0.3, 0.6, 0.9]])).requires_grad_()
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    ctx = LossContext(
        logp_curr=logp,
        logp_old=logp.detach() - 0.05,
        advantages=torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, 0.0]]),
        action_mask=mask,
        obs_mask=torch.zeros_like(mask),
        aggregate=Aggregation("token-mean", horizon=mask.shape[1]),
        logp_ref=logp.detach() + 0.05,
        logp_rollout=logp.detach() - 0.05,
        params={"eps_clip": 0.2, "eps_clip_high": 0.2, "kl_beta": 0.0},
    )
    where = f"loss {name!r} ({getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)})"
    try:
        out = fn(ctx)
    except Exception as exc:  # noqa: BLE001 - any failure of user code stops the run with its message
        raise ConfigError(f"{where} fails on a small batch: {type(exc).__name__}: {exc}") from exc
    loss, _ = _checked(where, out)
    if not loss.requires_grad:
        raise ConfigError(f"{where} returned a loss without a gradient: it must depend on ctx.logp_curr.")
    if not bool(torch.isfinite(loss)):
        raise ConfigError(f"{where} returned a non-finite loss ({loss.item()}) on a small well-formed batch.")
